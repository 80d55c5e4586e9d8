package idemsqs_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/store/idemsqlite"
)

// TestCrashChild is the consumer process TestCrashRestart starts and
// SIGKILLs; it does nothing unless started that way.
func TestCrashChild(t *testing.T) {
	queue, dlq, dsn := os.Getenv("IDEM_CRASH_QUEUE"), os.Getenv("IDEM_CRASH_DLQ"), os.Getenv("IDEM_CRASH_DB")
	if queue == "" {
		t.Skip("started only by TestCrashRestart")
	}
	st, err := idemsqlite.Open(context.Background(), dsn, &idemsqlite.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	l := &ledger{store: st}
	c := newConsumer(t, sqsClient(t), queue, dlq, l.process(), func(cfg *idemsqs.Config) {
		cfg.Name = "crash"
		cfg.Concurrency = 4
		cfg.BatchProcess = l.batch()
	})
	c.Run(context.Background()) // until killed
}

// TestCrashRestart: messages with 30% duplicate publishes flow while the
// consumer process is SIGKILLed and restarted every one to three seconds;
// the ledger ends exact: every message applied once, none lost. It sends
// 2,000 messages, to keep CI's time (goaws takes one HTTP call a send), or
// 10,000 with IDEM_SQS_CRASH_FULL=1 (about two minutes under -race).
func TestCrashRestart(t *testing.T) {
	t.Parallel()
	msgs := 2_000
	if os.Getenv("IDEM_SQS_CRASH_FULL") != "" {
		msgs = 10_000
	}
	c := sqsClient(t)
	q := newQueue(t, c, t.Name(), map[string]string{"VisibilityTimeout": "2"})
	dlq := newQueue(t, c, t.Name()+"-dlq", nil)
	l := newLedger(t)
	dsn := filepath.Join(filepath.Dir(dbPath(t, l.db)), "idem.db")

	ids := make([]int, 0, msgs*13/10)
	for i := range msgs {
		ids = append(ids, i)
	}
	for range msgs * 3 / 10 {
		ids = append(ids, rand.IntN(msgs))
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	// One send each: goaws v0.4.5 drops the message attributes of
	// SendMessageBatch entries, and with them the idem-id.
	var wg sync.WaitGroup
	sends := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range sends {
				if _, err := idemsqs.Publish(context.Background(), c, q, idemsqs.Message{Body: fmt.Sprintf("acct-%d", i), ID: fmt.Sprintf("crash-%d", i)}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for _, i := range ids {
		sends <- i
	}
	close(sends)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	applied := func() int {
		var n int
		if err := l.db.QueryRow(`SELECT count(*) FROM effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "IDEM_CRASH_QUEUE="+q, "IDEM_CRASH_DLQ="+dlq, "IDEM_CRASH_DB="+dsn)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kills := 0
	began := time.Now()
	deadline := began.Add(4 * time.Minute)
	for applied() < msgs || queueDepth(t, c, q) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d applied after %d kills", applied(), msgs, kills)
		}
		cmd := start()
		time.Sleep(time.Duration(1000+rand.IntN(2000)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		kills++
	}
	var n, maxApplied int
	if err := l.db.QueryRow(`SELECT count(*), max(applied) FROM effects`).Scan(&n, &maxApplied); err != nil {
		t.Fatal(err)
	}
	if n != msgs || maxApplied != 1 {
		t.Fatalf("ledger: %d messages applied, at most %d times each; want %d, once", n, maxApplied, msgs)
	}
	if d := queueDepth(t, c, dlq); d != 0 {
		t.Fatalf("%d dead letters", d)
	}
	t.Logf("%d messages (%d publishes) exact after %d SIGKILLs in %v", msgs, len(ids), kills, time.Since(began).Round(time.Second))
}

// dbPath is the file of the SQLite database db.
func dbPath(t *testing.T, db *sql.DB) string {
	t.Helper()
	var seq int
	var name, file string
	if err := db.QueryRow(`PRAGMA database_list`).Scan(&seq, &name, &file); err != nil {
		t.Fatal(err)
	}
	return file
}
