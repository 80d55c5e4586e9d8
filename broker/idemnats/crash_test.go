package idemnats_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestCrashChild is the consumer process TestCrashRestart starts and
// SIGKILLs; it does nothing unless started that way.
func TestCrashChild(t *testing.T) {
	stream, dlq, db := os.Getenv("IDEM_CRASH_STREAM"), os.Getenv("IDEM_CRASH_DLQ"), os.Getenv("IDEM_CRASH_DB")
	if stream == "" {
		t.Skip("started only by TestCrashRestart")
	}
	ctx := context.Background()
	nc, err := nats.Connect(natsURL(t))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	st, err := idemsqlite.Open(ctx, "sqlite://"+db, &idemsqlite.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{nc: nc, js: js, stream: stream, dlq: dlq, store: st}
	c, err := idemnats.NewConsumer(js, &idemnats.Config{Config: consume.Config{Name: "crash", Retry: fast, Logger: quiet},
		Stream: stream, Consumer: "c", DeadLetterSubject: dlq, Process: e.process(nil), Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	c.Run(ctx) // until killed
}

// TestCrashRestart: 10,000 messages with 30% duplicate publishes (sent
// after the stream's duplicate window, so the broker lets them through)
// flow while the consumer process is SIGKILLed and restarted every ~second;
// the ledger ends exact: every message applied once, none lost.
func TestCrashRestart(t *testing.T) {
	// Not parallel: it runs before the other tests, alone on the store's
	// disk, whose fsyncs bound its rate.
	msgs := 10_000
	if testing.Short() || raceEnabled {
		// The full run takes ~25s without -race; under it, 3,000 keep the
		// module's race run near a minute.
		msgs = 3_000
	}
	e := newEnv(t, 100*time.Millisecond)
	ctx := context.Background()
	e.consumer(t, "c", time.Second, -1)
	pub := func(ids []int) {
		var futs []jetstream.PubAckFuture
		for _, i := range ids {
			m := nats.NewMsg(e.subject)
			m.Data = fmt.Appendf(nil, `{"i":%d}`, i)
			m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("m-%d", i))
			f, err := e.js.PublishMsgAsync(m)
			if err != nil {
				t.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatal(err)
			}
		}
	}
	ids := make([]int, msgs)
	for i := range ids {
		ids[i] = i
	}
	pub(ids)
	time.Sleep(300 * time.Millisecond) // past the duplicate window
	dups := make([]int, msgs*3/10)
	for i := range dups {
		dups[i] = rand.IntN(msgs)
	}
	pub(dups)
	// Repeats inside the duplicate list may still fall in one window.
	stored := streamMsgs(t, e, e.stream)
	if stored < uint64(msgs+len(dups)/2) {
		t.Fatalf("stream holds %d; the duplicates did not get through", stored)
	}

	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "IDEM_CRASH_STREAM="+e.stream, "IDEM_CRASH_DLQ="+e.dlq, "IDEM_CRASH_DB="+e.store.Path(), "IDEM_NATS_URL="+natsURL(t))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kills := 0
	for range 4 {
		cmd := start()
		time.Sleep(time.Duration(700+rand.IntN(800)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		kills++
	}
	cmd := start()
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGKILL); cmd.Wait() })
	cons, err := e.js.Consumer(ctx, e.stream, "c")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "every message acked", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0
	})
	got := e.effects(t)
	if len(got) != msgs {
		t.Fatalf("%d messages applied, want %d (%d lost) after %d kills", len(got), msgs, msgs-len(got), kills)
	}
	for k, v := range got {
		if v != 1 {
			t.Fatalf("%s applied %d times", k, v)
		}
	}
	if n := streamMsgs(t, e, e.stream+"_DLQ"); n != 0 {
		t.Fatalf("%d dead letters", n)
	}
	t.Logf("%d messages, %d stored with duplicates, %d kills: exact ledger", msgs, stored, kills)
}
