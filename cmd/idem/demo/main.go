// Command demo is `idem demo` on its own, the README's main job:
//
//	go run ./cmd/idem/demo
//
// It runs the same demo (package cmd/idem/internal/demo) with the same flags
// and IDEM_DEMO_* variables and exit status (0 exact, 1 failed, 2 bad
// command line) as `idem demo`, but imports only idem, idemhttp, idemsqlite
// and the standard library: its first run with an empty build cache compiles
// about half of what the whole CLI needs (no cobra, pgx, rueidis, AWS SDK,
// Prometheus or chromedp).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/idem-go/idem/cmd/idem/internal/demo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// envFlags are the flags with an environment fallback, as in `idem demo`.
var envFlags = []string{"seed", "messages", "workers", "requests"}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o := demo.Defaults
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Store, "store", o.Store, "SQLite store for the ledger, sqlite://PATH (default: a temporary file)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the delivery order and amounts (env IDEM_DEMO_SEED)")
	fs.IntVar(&o.Messages, "messages", o.Messages, "number of distinct payment messages (env IDEM_DEMO_MESSAGES)")
	fs.IntVar(&o.Workers, "workers", o.Workers, "goroutines of the concurrent idem run, 0 skips it (env IDEM_DEMO_WORKERS)")
	fs.IntVar(&o.Requests, "requests", o.Requests, "parallel retries of one payment through the HTTP middleware, 0 skips it (env IDEM_DEMO_REQUESTS)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./cmd/idem/demo [flags]   (the same as: idem demo [flags])\n\n%s\n\nFlags:\n", demo.Long)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idem demo: unexpected arguments %q\n", fs.Args())
		return 2
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range envFlags {
		env := "IDEM_DEMO_" + strings.ToUpper(name)
		if v := getenv(env); v != "" && !given[name] {
			if err := fs.Set(name, v); err != nil {
				fmt.Fprintf(stderr, "idem demo: invalid value %q in %s for --%s: want a whole number\n", v, env, name)
				return 2
			}
		}
	}
	err := demo.Run(ctx, stdout, o)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "idem demo: %s\n", strings.TrimPrefix(err.Error(), "demo: "))
	if ue := (*demo.UsageError)(nil); errors.As(err, &ue) {
		return 2
	}
	return 1
}
