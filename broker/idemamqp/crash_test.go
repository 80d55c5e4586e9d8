package idemamqp_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemamqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestCrashChild is the consumer process TestCrashRestart starts and
// SIGKILLs; it does nothing unless started that way.
func TestCrashChild(t *testing.T) {
	queue, schema := os.Getenv("IDEM_CRASH_QUEUE"), os.Getenv("IDEM_CRASH_SCHEMA")
	if queue == "" {
		t.Skip("started only by TestCrashRestart")
	}
	pg := attachPG(t, schema)
	c, _ := newConsumer(t, idemamqp.DialURL(amqpURL(t)), idemamqp.Topology{Queue: queue}.WithDefaults(), pg.idemProcess(pg.creditHandler(nil)),
		func(cfg *idemamqp.Config) { cfg.Name = "crash"; cfg.Concurrency = 8 })
	c.Run(context.Background()) // until killed
}

// TestCrashRestart: 10,000 messages with 30% duplicate publishes flow while
// the consumer process is SIGKILLed and restarted every ~second; the ledger
// ends exact: every message applied once, none lost.
func TestCrashRestart(t *testing.T) {
	t.Parallel()
	msgs := 10_000
	if testing.Short() {
		msgs = 2_000
	}
	pg := newPG(t)
	topo, conn := newTopology(t)

	// Publish everything first, duplicates shuffled in, with confirms.
	ids := make([]int, 0, msgs*13/10)
	for i := range msgs {
		ids = append(ids, i)
	}
	for range msgs * 3 / 10 {
		ids = append(ids, rand.IntN(msgs))
	}
	rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	var pending []*amqp.DeferredConfirmation
	for _, i := range ids {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", topo.Queue, false, false, amqp.Publishing{
			MessageId: fmt.Sprintf("crash-%d", i), DeliveryMode: amqp.Persistent, Body: body(fmt.Sprintf("acct-%d", i), 1),
		})
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, dc)
	}
	for _, dc := range pending {
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatal("publish not confirmed", err)
		}
	}
	ch.Close()

	applied := func() int {
		var n int
		if err := pg.pool.QueryRow(context.Background(), fmt.Sprintf("SELECT count(*) FROM %s", pg.table())).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "IDEM_CRASH_QUEUE="+topo.Queue, "IDEM_CRASH_SCHEMA="+pg.schema)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kills := 0
	deadline := time.Now().Add(90 * time.Second)
	for applied() < msgs || queueDepth(t, conn, topo.Queue) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d applied after %d kills", applied(), msgs, kills)
		}
		cmd := start()
		time.Sleep(time.Duration(1500+rand.IntN(1500)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		kills++
	}
	var n, total, maxApplied int
	err = pg.pool.QueryRow(context.Background(), fmt.Sprintf("SELECT count(*), sum(amount), max(applied) FROM %s", pg.table())).Scan(&n, &total, &maxApplied)
	if err != nil {
		t.Fatal(err)
	}
	if n != msgs || total != msgs || maxApplied != 1 {
		t.Fatalf("ledger: %d accounts, total %d, max applications %d; want %d, %d, 1", n, total, maxApplied, msgs, msgs)
	}
	if d := queueDepth(t, conn, topo.DeadLetterQueue); d != 0 {
		t.Fatalf("%d dead letters", d)
	}
	t.Logf("%d messages (%d publishes) exact after %d SIGKILLs", msgs, len(ids), kills)
}
