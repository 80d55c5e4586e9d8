//go:build unix

package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// BenchmarkProcessSideBySide is bench's "SQLite: dedupe + ledger effect"
// group in miniature: Process against the textbook pattern (BEGIN;
// INSERT … ON CONFLICT DO NOTHING; UPDATE the ledger if a row was
// inserted; COMMIT, one writer connection) with 30 % duplicates, at
// concurrency 1 and 8, interleaved. One op is one delivery. Run with
//
//	go test -run '^$' -bench ProcessSideBySide -benchtime=2000x -count 3
func BenchmarkProcessSideBySide(b *testing.B) {
	for _, c := range []int{1, 8} {
		b.Run(fmt.Sprintf("textbook/c=%d", c), func(b *testing.B) { benchTextbook(b, c) })
		b.Run(fmt.Sprintf("Process/c=%d", c), func(b *testing.B) { benchProcess(b, c) })
	}
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per op since start: on a loaded machine
// it varies less than the wall time.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/op")
}

// dupKeys returns n deliveries where 30 % repeat an earlier one.
func dupKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		if i%10 < 3 && i > 0 {
			keys[i] = keys[i/2]
			continue
		}
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	return keys
}

// eachDelivery runs fn for deliveries [0, n) on workers goroutines.
func eachDelivery(b *testing.B, workers, n int, fn func(w, i int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(w, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

func createLedger(b *testing.B, db *sql.DB) {
	for _, q := range []string{
		"CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
		"WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM g WHERE i < 63) INSERT INTO accounts SELECT i, 0 FROM g",
	} {
		if _, err := db.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
}

func credit(ctx context.Context, tx *sql.Tx, w int) error {
	_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + ? WHERE id = ?", 1, w)
	return err
}

func checkLedger(b *testing.B, db *sql.DB, keys []string) {
	distinct := map[string]bool{}
	for _, k := range keys {
		distinct[k] = true
	}
	var total int
	if err := db.QueryRow("SELECT coalesce(sum(balance), 0) FROM accounts").Scan(&total); err != nil {
		b.Fatal(err)
	}
	if total != len(distinct) {
		b.Fatalf("ledger holds %d credits, want %d", total, len(distinct))
	}
}

func benchTextbook(b *testing.B, c int) {
	ctx := context.Background()
	db, err := OpenDB(ctx, filepath.Join(b.TempDir(), "plain.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec("CREATE TABLE processed (id TEXT PRIMARY KEY)"); err != nil {
		b.Fatal(err)
	}
	createLedger(b, db)
	keys := dupKeys(b.N)
	b.ResetTimer()
	cpu := cpuTime()
	eachDelivery(b, c, b.N, func(w, i int) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		res, err := tx.ExecContext(ctx, "INSERT INTO processed (id) VALUES (?) ON CONFLICT DO NOTHING", keys[i])
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 1 {
			if err := credit(ctx, tx, w); err != nil {
				return err
			}
		}
		return tx.Commit()
	})
	b.StopTimer()
	reportCPU(b, cpu)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	checkLedger(b, db, keys)
}

func benchProcess(b *testing.B, c int) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "idem.db"), &Config{AutoMigrate: true, Logger: quietLogger})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	createLedger(b, s.DB())
	keys := dupKeys(b.N)
	msgs := make([]idem.Message, len(keys))
	for i, k := range keys {
		msgs[i] = idem.Message{Scope: "bench", Key: k, Fingerprint: idem.FingerprintBytes([]byte(k))}
	}
	b.ResetTimer()
	cpu := cpuTime()
	eachDelivery(b, c, b.N, func(w, i int) error {
		_, err := s.Process(ctx, msgs[i], func(ctx context.Context, tx *sql.Tx) error {
			return credit(ctx, tx, w)
		})
		return err
	})
	b.StopTimer()
	reportCPU(b, cpu)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	if n := s.batches.Load(); n > 0 {
		b.ReportMetric(float64(b.N)/float64(n), "msgs/shared-tx")
	}
	checkLedger(b, s.DB(), keys)
}
