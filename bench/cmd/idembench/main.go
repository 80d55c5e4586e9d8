// Command idembench runs idem's side-by-side benchmarks against the
// textbook pattern, River, Watermill and the raw ceilings, in one run
// against the same PostgreSQL and Redis, and writes BENCHMARKS.md and PNG
// charts.
//
//	go run ./cmd/idembench --out ../BENCHMARKS.md --charts ../docs/bench
//
// Flags: --quick (every scenario once at a small size), --runs N (default
// 5), --out, --charts, --postgres (default $IDEM_POSTGRES_URL), --redis
// (default $IDEM_REDIS_URL), --mysql (default $IDEM_MYSQL_URL), --only (substring filter on group or name),
// --load-note (recorded in the report), --no-cold-start (skip the cold build
// of ./cmd/idem with an empty build cache, about 1½ minutes; --quick skips
// it too), --cpuprofile FILE.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"

	"github.com/idem-go/idem/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(1)
	}
}

func run() error {
	var cfg bench.Config
	flag.BoolVar(&cfg.Quick, "quick", false, "run every scenario once at a small size (CI)")
	flag.IntVar(&cfg.Runs, "runs", 0, "timed runs per scenario (default 5, 1 with --quick)")
	flag.StringVar(&cfg.Out, "out", "BENCHMARKS.md", "report path")
	flag.StringVar(&cfg.Charts, "charts", "docs/bench", "chart directory (empty: no charts)")
	flag.StringVar(&cfg.PostgresURL, "postgres", os.Getenv("IDEM_POSTGRES_URL"), "PostgreSQL URL")
	flag.StringVar(&cfg.RedisURL, "redis", os.Getenv("IDEM_REDIS_URL"), "Redis URL")
	flag.StringVar(&cfg.MySQLURL, "mysql", os.Getenv("IDEM_MYSQL_URL"), "MySQL / MariaDB URL (mysql://…) or driver DSN")
	flag.StringVar(&cfg.LoadNote, "load-note", "", "note on other load on the machine, recorded in the report")
	flag.BoolVar(&cfg.NoColdStart, "no-cold-start", false, "skip timing the cold build of ./cmd/idem with an empty build cache")
	only := flag.String("only", "", "run only scenarios whose group or name contains this")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if cfg.Runs < 0 || cfg.Runs > 100 {
		return fmt.Errorf("--runs %d out of range 1..100", cfg.Runs)
	}
	if *only != "" {
		cfg.Filter = func(s *bench.Scenario) bool {
			return strings.Contains(s.Group, *only) || strings.Contains(s.Name, *only)
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cfg.Command = "go run ./cmd/idembench " + strings.Join(os.Args[1:], " ")
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := bench.Generate(ctx, cfg)
	if rep != nil {
		fmt.Fprintf(os.Stderr, "wrote %s\n", cfg.Out)
		for _, h := range rep.Headlines() {
			fmt.Fprintf(os.Stderr, "  %-48s %8.2f (target %.2f)\n", h.What, h.Value, h.Target)
		}
		if c := rep.ColdStart; c != nil && c.Err == nil {
			fmt.Fprintf(os.Stderr, "  cold build of %s: %.1f s wall, %.0f CPU-s (target < %.0f s wall)\n",
				c.Package, c.Wall.Seconds(), c.CPU().Seconds(), bench.ColdStartTarget.Seconds())
		}
	}
	return err
}
