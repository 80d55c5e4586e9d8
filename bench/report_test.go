package bench_test

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/bench"
	"github.com/idem-go/idem/idemtest"
)

// TestQuickReport runs every scenario once at the quick size against the
// real servers and checks that the report is well formed: every scenario
// has a row with a number, the header names the machine and command, and
// every chart is a PNG. No timing is judged.
func TestQuickReport(t *testing.T) {
	pg := idemtest.ServiceURL(t, "IDEM_POSTGRES_URL")
	rd := idemtest.ServiceURL(t, "IDEM_REDIS_URL")
	dir := t.TempDir()
	out := filepath.Join(dir, "BENCHMARKS.md")
	rep, err := bench.Generate(context.Background(), bench.Config{
		PostgresURL: pg, RedisURL: rd, MySQLURL: idemtest.ServiceURL(t, "IDEM_MYSQL_URL"), Quick: true,
		Out: out, Charts: filepath.Join(dir, "docs", "bench"), Command: "test",
	})
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	text := string(md)
	for _, want := range []string{"- **Date:**", "CPUs", "PostgreSQL 1", "Redis ", "- **Command:** `test`", "QUICK mode", "ratios", "## Headline ratios"} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	scenarios := bench.Scenarios(bench.QuickSizes)
	if len(rep.Results) != len(scenarios) {
		t.Fatalf("%d results for %d scenarios", len(rep.Results), len(scenarios))
	}
	for _, r := range rep.Results {
		if len(r.Rates) != 1 || r.Median() <= 0 {
			t.Errorf("%s: rates %v", r.Scenario.ID(), r.Rates)
		}
		if !strings.Contains(text, "| "+r.Scenario.Name+" | ") {
			t.Errorf("report has no row for %q", r.Scenario.Name)
		}
	}
	if strings.Contains(text, "failed:") {
		t.Error("report has a failed row")
	}
	for _, g := range bench.Groups {
		if !strings.Contains(text, "## "+g) {
			t.Errorf("report has no section %q", g)
		}
	}
	charts, _ := filepath.Glob(filepath.Join(dir, "docs", "bench", "*.png"))
	if len(charts) != len(bench.Groups) {
		t.Fatalf("%d charts, want %d", len(charts), len(bench.Groups))
	}
	for _, c := range charts {
		b, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(bytes.NewReader(b)); err != nil {
			t.Errorf("%s: %v", c, err)
		}
		if !strings.Contains(text, "](docs/bench/"+filepath.Base(c)+")") {
			t.Errorf("report does not link %s", filepath.Base(c))
		}
	}
}

// TestMissingServices checks that scenarios needing a server that is not
// configured fail in their row, and the rest still run and are reported.
func TestMissingServices(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "B.md")
	rep, err := bench.Generate(context.Background(), bench.Config{
		Quick: true, Out: out,
		Filter: func(s *bench.Scenario) bool { return s.Group == bench.GroupRedis || s.Group == bench.GroupConsumer },
	})
	if err == nil || !strings.Contains(err.Error(), "no Redis URL") {
		t.Fatalf("err = %v, want the missing Redis URL", err)
	}
	failed, ran := 0, 0
	for _, r := range rep.Results {
		switch {
		case r.Err != nil:
			failed++
		case r.Median() > 0:
			ran++
		}
	}
	if failed != 8 || ran != 8 {
		t.Fatalf("failed %d, ran %d; want 8 and 8", failed, ran)
	}
	md, _ := os.ReadFile(out)
	if strings.Count(string(md), "failed: no Redis URL") != 8 {
		t.Errorf("report:\n%s", md)
	}
}

// TestBadOutput checks that an unwritable report path is an error.
func TestBadOutput(t *testing.T) {
	t.Parallel()
	_, err := bench.Generate(context.Background(), bench.Config{
		Quick: true, Out: filepath.Join(t.TempDir(), "missing", "B.md"),
		Filter: func(s *bench.Scenario) bool { return s.Group == bench.GroupConsumer && s.Role == bench.RolePeer },
	})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want a missing directory", err)
	}
}
