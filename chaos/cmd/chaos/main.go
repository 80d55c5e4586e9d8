// Command chaos is idem's reliability suite: it runs each broker and store
// combination under faults and checks that no effect is lost or
// duplicated. See the chaos module's doc.go and RELIABILITY.md.
//
//	chaos run [flags]   run scenarios (chaos run -h for the flags)
//	chaos list          list the scenarios
//	chaos worker        one consumer process (started by run)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "worker":
		err = runWorker()
	case "run":
		var failed bool
		failed, err = runCommand(os.Args[2:])
		if err == nil && failed {
			os.Exit(1)
		}
	case "list":
		for _, s := range scenarios {
			fmt.Printf("%-24s %s\n", s.name, s.guarantee)
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: chaos run [-quick] [-scenarios a,b] [-messages N] [-workers K] ... | chaos list | chaos worker")
	os.Exit(2)
}

func runCommand(args []string) (failed bool, err error) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "a small run of every scenario (CI): 2,000 messages, 3 workers, faults every second or two")
	list := fs.String("scenarios", "all", "comma-separated scenarios to run (chaos list)")
	messages := fs.Int("messages", 0, "distinct messages per scenario (default 100000, quick 2000)")
	workers := fs.Int("workers", 0, "worker processes per scenario (default 4, quick 3)")
	rate := fs.Float64("rate", -1, "publish rate in messages a second, 0 unpaced (default 0, quick 500)")
	noFaults := fs.Bool("no-relay", false, "do not put fault relays between the workers and the servers")
	timeout := fs.Duration("timeout", 0, "per scenario (default 30m, quick 60s)")
	keep := fs.Bool("keep", false, "keep the PostgreSQL schemas of the run")
	logDir := fs.String("logs", "", "write each scenario's worker logs to DIR/SCENARIO.log")
	seed := fs.Uint64("seed", 0, "random seed (default: the time)")
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	cfg := &runConfig{
		messages: 100000, workers: 4, dupRate: 0.3, poisonEvery: 100,
		killEvery: [2]time.Duration{2 * time.Second, 5 * time.Second}, zombieEvery: 10 * time.Second,
		faultEvery: [2]time.Duration{2 * time.Second, 5 * time.Second},
		lease:      3 * time.Second, ackWait: 3 * time.Second,
		restartEvery: [2]time.Duration{15 * time.Second, 30 * time.Second}, restartPause: 2 * time.Second,
		faults: !*noFaults, timeout: 30 * time.Minute, shutdownBound: 15 * time.Second,
		keep: *keep, logDir: *logDir, seed: *seed, progress: 30 * time.Second,
	}
	if *quick {
		cfg.messages, cfg.workers, cfg.rate = 2000, 3, 500
		cfg.killEvery = [2]time.Duration{time.Second, 2 * time.Second}
		cfg.zombieEvery = 3 * time.Second
		cfg.faultEvery = [2]time.Duration{time.Second, 2 * time.Second}
		cfg.lease, cfg.ackWait = 2*time.Second, 2*time.Second
		cfg.restartEvery, cfg.restartPause = [2]time.Duration{3 * time.Second, 5 * time.Second}, time.Second
		cfg.timeout = 60 * time.Second
		cfg.progress = 0
	}
	if *messages > 0 {
		cfg.messages = *messages
	}
	if *workers > 0 {
		cfg.workers = *workers
	}
	if *rate >= 0 {
		cfg.rate = *rate
	}
	if *timeout > 0 {
		cfg.timeout = *timeout
	}
	if cfg.seed == 0 {
		cfg.seed = uint64(time.Now().UnixNano())
	}
	sel, unknown := selectScenarios(*list, *quick)
	if len(unknown) > 0 {
		return false, fmt.Errorf("unknown scenarios %s (chaos list)", strings.Join(unknown, ", "))
	}
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	ci := os.Getenv("CI") == "true"
	fmt.Printf("chaos: %d scenarios, %d messages each, %d workers, seed %d, relays %v\n",
		len(sel), cfg.messages, cfg.workers, cfg.seed, cfg.faults)
	passed, nfailed, skipped := 0, 0, 0
	start := time.Now()
	for _, sc := range sel {
		res := runScenario(ctx, exe, sc, cfg, os.Stdout)
		if errors.Is(res.err, errMissing) && !ci {
			fmt.Printf("--- %s: SKIP (%v)\n", sc.name, res.err)
			skipped++
			continue
		}
		res.report(os.Stdout)
		if res.passed() {
			passed++
		} else {
			nfailed++
		}
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Printf("chaos: %s\n", time.Since(start).Round(time.Second))
	if skipped > 0 {
		fmt.Printf("%d passed, %d failed, %d skipped\n", passed, nfailed, skipped)
	} else {
		fmt.Printf("%d passed, %d failed\n", passed, nfailed)
	}
	return nfailed > 0, nil
}
