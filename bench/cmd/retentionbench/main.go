// Command retentionbench runs the group "PostgreSQL: claims during
// retention" of idembench at a large size, for the long benchmark of the
// partitioned layout (10M, 50M expired rows): it prepares the group's four
// tables (each a bulk load), then makes
// --runs timed runs of each row, interleaved, and prints every run's
// claims/s and each row's median, min–max and ratio to the partitioned
// row without retention. Unlike idembench it does not rerun noisy rows:
// at these sizes each run of the drop row refills its partition, minutes
// of work. With IDEM_BENCH_VERBOSE each run also prints the rows the table
// held, the rows the retention retired and the table's size.
//
//	IDEM_BENCH_VERBOSE=1 go run ./cmd/retentionbench --rows 10000000 --runs 3
//
// The tables go where the server's default_tablespace puts them; a
// --postgres URL that ends in &default_tablespace=NAME puts all four on
// tablespace NAME, for instance one on a filesystem mounted without online
// discard (see docs/operations.md: on a filesystem mounted with discard a
// large DROP stalls the server's commits while the device trims). For a
// server on this machine the report says which filesystem holds the tables
// and whether it is mounted with discard.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"time"

	"github.com/idem-go/idem/bench"
	"github.com/jackc/pgx/v5"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "retentionbench:", err)
		os.Exit(1)
	}
}

func run() error {
	rows := flag.Int("rows", 10_000_000, "expired rows each table starts with (and the drop retires each run)")
	runs := flag.Int("runs", 3, "timed runs per row")
	pg := flag.String("postgres", os.Getenv("IDEM_POSTGRES_URL"), "PostgreSQL URL")
	flag.Parse()
	if *rows < 1 || *runs < 1 {
		return errors.New("--rows and --runs must be positive")
	}
	if err := os.Setenv(bench.RetentionRowsEnv, strconv.Itoa(*rows)); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	env, err := bench.NewEnv(*pg, "")
	if err != nil {
		return err
	}
	defer env.Close()
	var group []*bench.Scenario
	for _, s := range bench.Scenarios(bench.FullSizes) {
		if s.Group == bench.GroupRetention {
			group = append(group, s)
		}
	}
	// One after the other: each fill already writes from several
	// connections, and the server is shared.
	start := time.Now()
	prepared := make([]bench.Run, len(group))
	for i, s := range group {
		var err error
		if prepared[i], err = s.Prepare(ctx, env, s); err != nil {
			return fmt.Errorf("prepare %s: %w", s.Name, err)
		}
	}
	fmt.Fprintf(os.Stderr, "prepared %d tables of %d expired rows in %v\n", len(group), *rows, time.Since(start).Round(time.Second))
	rates := make([][]float64, len(group))
	n := 0
	for r := range *runs {
		for i, s := range group {
			n++
			st := bench.NewStream(fmt.Sprintf("%s-ret%d", env.Prefix, n), s.Messages, s.DupPercent, uint64(n))
			run := prepared[i]
			if run.Before != nil {
				if err := run.Before(ctx, st); err != nil {
					return fmt.Errorf("%s run %d: before: %w", s.Name, r+1, err)
				}
			}
			rate, err := run.Rate(ctx, st) // claims only: see bench/retention.go
			if err != nil {
				return fmt.Errorf("%s run %d: %w", s.Name, r+1, err)
			}
			if run.After != nil {
				if err := run.After(ctx, st); err != nil {
					return fmt.Errorf("%s run %d: check: %w", s.Name, r+1, err)
				}
			}
			rates[i] = append(rates[i], rate)
			fmt.Fprintf(os.Stderr, "%s %s run %d: %.0f claims/s\n", time.Now().UTC().Format("15:04:05"), s.Name, r+1, rate)
		}
	}
	if conn, err := pgx.Connect(ctx, *pg); err == nil {
		if where := bench.PostgresStorage(ctx, conn); where != "" {
			fmt.Printf("Tables: %s.\n\n", where)
		}
		_ = conn.Close(ctx)
	}
	ref := median(rates[0])
	fmt.Printf("| row | claims/s median (min–max), %d runs | vs %s |\n|---|---|---:|\n", *runs, group[0].Name)
	for i, s := range group {
		fmt.Printf("| %s | %.1fk (%.1fk–%.1fk) | %.0f %% |\n", s.Name, median(rates[i])/1000,
			slices.Min(rates[i])/1000, slices.Max(rates[i])/1000, 100*median(rates[i])/ref)
	}
	return nil
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
