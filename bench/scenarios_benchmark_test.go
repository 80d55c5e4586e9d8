package bench_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem/bench"
	"github.com/idem-go/idem/idemtest"
)

// BenchmarkScenarios runs every row of BENCHMARKS.md as a Go benchmark at
// the quick size: one b.N iteration is one run of the scenario, reported as
// msgs/s. `make bench-quick` (-benchtime=1x) runs each once so none rots;
// the report itself comes from cmd/idembench.
func BenchmarkScenarios(b *testing.B) {
	pg := idemtest.ServiceURL(b, "IDEM_POSTGRES_URL")
	rd := idemtest.ServiceURL(b, "IDEM_REDIS_URL")
	env, err := bench.NewEnv(pg, rd)
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	env.MySQLURL = idemtest.ServiceURL(b, "IDEM_MYSQL_URL")
	for _, s := range bench.Scenarios(bench.QuickSizes) {
		name := strings.NewReplacer(" ", "_", "…", "", "×", "x").Replace(fmt.Sprintf("%s/%s/c%d/dup%d", s.Group[:strings.IndexAny(s.Group, ": ")], s.Name, s.Concurrency, s.DupPercent))
		b.Run(name, func(b *testing.B) {
			results, err := bench.Measure(context.Background(), env, []*bench.Scenario{s}, &bench.Options{Runs: b.N})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(results[0].Median(), "msgs/s")
		})
	}
}
