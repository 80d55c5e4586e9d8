package idempgx_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// The COPY path under SIGKILL: consumer processes run the same stream of
// batches (each big enough to be copied), each from its start, as
// redeliveries after a crash do; the parent kills them at random moments,
// some during a COPY, starts them again, and at the end every key has
// exactly one effect and one record, and some COPYs committed.

const (
	envCopyCrashSchema = "IDEM_TEST_COPY_CRASH_SCHEMA"
	copyCrashBatches   = 40
	copyCrashBatch     = 150
)

// copyCrashStream is batch b of the stream: fresh keys, and from the
// second batch on a fifth of them repeats of the batch before (stored, or
// in flight in another process).
func copyCrashStream(b int) []idem.Message {
	msgs := make([]idem.Message, copyCrashBatch)
	for i := range msgs {
		k := fmt.Sprintf("c%03d-%03d", b, i)
		if b > 0 && i%5 == 0 {
			k = fmt.Sprintf("c%03d-%03d", b-1, i+1)
		}
		msgs[i] = idem.Message{Key: k, Fingerprint: fp(k)}
	}
	return msgs
}

// TestProcessBatchCopyCrashProcess is the consumer of
// TestProcessBatchCopyCrash, run as a child process; it does nothing in a
// normal run. It prints a line per batch with the COPYs its store ran and
// how many of them failed.
func TestProcessBatchCopyCrashProcess(t *testing.T) {
	schema := os.Getenv(envCopyCrashSchema)
	if schema == "" {
		t.Skip("consumer process of TestProcessBatchCopyCrash")
	}
	s, copies := copyCounted(t, schema, idempgx.Config{})
	effects := qualified(s, "crash_effects")
	ctx := context.Background()
	for b := range copyCrashBatches {
		msgs := copyCrashStream(b)
		_, err := s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
			keys := make([]string, len(fresh))
			for n, i := range fresh {
				keys[n] = msgs[i].Key
			}
			_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (key) SELECT unnest($1::text[])", keys)
			return err
		})
		if err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		fmt.Printf("batch %d copies %d failed %d\n", b, copies.starts.Load(), copies.failed.Load())
	}
}

func TestProcessBatchCopyCrash(t *testing.T) {
	t.Parallel()
	schema := migratedSchema(t)
	s, _ := copyCounted(t, schema, idempgx.Config{})
	ctx := ctxT(t)
	effects := qualified(s, "crash_effects")
	if _, err := s.Pool().Exec(ctx, "CREATE TABLE "+effects+" (key text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const (
		consumers = 3
		kills     = 4 // per consumer
	)
	var (
		mu              sync.Mutex
		copied, failed  int
		killed, endings int
	)
	// run starts a consumer and kills it after a random moment, or lets it
	// finish the stream when kill is false.
	run := func(kill bool) error {
		cmd := exec.Command(os.Args[0], "-test.run=^TestProcessBatchCopyCrashProcess$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), envCopyCrashSchema+"="+schema)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		// When kill, the process is killed once it wrote two batches, at a
		// random moment of the next ones (a COPY, a handler, a commit).
		var timer <-chan time.Time
		batches, c, f := 0, 0, 0
		var tail []string
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					err := cmd.Wait()
					mu.Lock()
					copied, failed = copied+c, failed+f
					mu.Unlock()
					if kill && err != nil && strings.Contains(err.Error(), "killed") {
						return nil
					}
					if err != nil || batches != copyCrashBatches && !kill {
						return fmt.Errorf("consumer: %v after %d batches; last output:\n%s", err, batches, strings.Join(tail, "\n"))
					}
					return nil
				}
				tail = append(tail, l)
				if len(tail) > 20 {
					tail = tail[1:]
				}
				var b, nc, nf int
				if n, _ := fmt.Sscanf(l, "batch %d copies %d failed %d", &b, &nc, &nf); n == 3 {
					batches, c, f = batches+1, nc, nf
					if kill && batches == 2 {
						timer = time.After(time.Duration(rand.IntN(60)) * time.Millisecond)
					}
				}
			case <-timer:
				timer = nil
				if err := cmd.Process.Signal(syscall.SIGKILL); errors.Is(err, os.ErrProcessDone) {
					continue // it finished first
				} else if err != nil {
					return err
				}
				mu.Lock()
				killed++
				mu.Unlock()
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, consumers)
	for range consumers {
		wg.Go(func() {
			for k := 0; k <= kills; k++ {
				if err := run(k < kills); err != nil {
					errs <- err
					return
				}
			}
			mu.Lock()
			endings++
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Every key of the stream: one effect, one record.
	want := map[string]bool{}
	for b := range copyCrashBatches {
		for _, m := range copyCrashStream(b) {
			want[m.Key] = true
		}
	}
	for _, c := range []struct{ what, sql string }{
		{"effects", "SELECT key, count(*) FROM " + effects + " GROUP BY key"},
		{"records", "SELECT key, count(*) FROM " + qualified(s, "idem_records") + " GROUP BY key"},
	} {
		rows, err := s.Pool().Query(ctx, c.sql)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		var (
			key string
			n   int
		)
		if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { got[key] = n; return nil }); err != nil {
			t.Fatal(err)
		}
		for k := range want {
			if got[k] != 1 {
				t.Errorf("%s: key %s has %d, want 1", c.what, k, got[k])
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d keys, want %d", c.what, len(got), len(want))
		}
	}
	t.Logf("%d consumers killed %d times, %d finished the stream; %d COPYs committed or met a key (%d failed on one), counted until each kill",
		consumers, killed, endings, copied, failed)
	if killed < consumers*kills/2 {
		t.Errorf("only %d kills landed before the consumers finished: the test did not crash them mid-stream", killed)
	}
	if copied-failed == 0 {
		t.Error("no COPY succeeded: the test did not exercise the COPY path")
	}
}
