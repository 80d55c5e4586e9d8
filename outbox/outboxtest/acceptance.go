package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/retry"
)

// Environment knobs of the acceptance test, so CI stays fast and a manual
// run can go large (IDEM_OUTBOX_EVENTS=50000).
const (
	EnvEvents  = "IDEM_OUTBOX_EVENTS"  // events written; default 3000 (under -race 1000, 300 for a SingleWriter)
	EnvProcs   = "IDEM_OUTBOX_PROCS"   // relay processes; default 3 (2 for a SingleWriter under -race)
	EnvWorkers = "IDEM_OUTBOX_WORKERS" // relay loops per process; default 4
	EnvKills   = "IDEM_OUTBOX_KILLS"   // SIGKILL + restart rounds; default 4
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type child struct {
	cmd *exec.Cmd
	out *lockedBuffer
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 1<<16 {
		return len(p), nil
	}
	return w.buf.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// RunAcceptance writes events in producer transactions (a quarter of them
// rolled back), then relay processes started with command (each must call
// [ServeRelay]) publish them to env.Record, SIGKILLs and restarts a relay
// process several times, mid-batch, and then checks what was recorded:
// every committed event at least once and marked sent, no event of a
// rolled-back transaction ever, and duplicates only of committed ids.
func RunAcceptance[Tx any](t *testing.T, env Env[Tx], command func() *exec.Cmd) {
	defaultN, defaultProcs := 3000, 3
	switch {
	case raceEnabled && env.SingleWriter:
		defaultN, defaultProcs = 300, 2
	case raceEnabled:
		defaultN = 1000
	}
	n := envInt(EnvEvents, defaultN)
	procs := envInt(EnvProcs, defaultProcs)
	kills := envInt(EnvKills, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Producers write first (a quarter of their transactions roll back), so
	// the relays start on a backlog and every kill lands mid-work.
	const producers, perTx = 4, 10
	var (
		wg       sync.WaitGroup
		l        = newLedger()
		errOnce  sync.Once
		writeErr error
	)
	start := time.Now()
	for p := range producers {
		wg.Go(func() {
			for tx := p; tx*perTx < n; tx += producers {
				evs := make([]outbox.Event, 0, perTx)
				for i := tx * perTx; i < min(n, (tx+1)*perTx); i++ {
					evs = append(evs, outbox.Event{Topic: "acceptance", Key: fmt.Sprint("k", i%17), ID: fmt.Sprintf("e-%07d", i), Payload: []byte(strconv.Itoa(i))})
				}
				if err := produce(ctx, env, l, evs, tx%4 == 3); err != nil {
					errOnce.Do(func() { writeErr = err })
					return
				}
			}
		})
	}

	wg.Wait()
	if writeErr != nil {
		t.Fatalf("producer: %v", writeErr)
	}
	committed, rolledBk := l.committed, l.rolledBack
	t.Logf("wrote %d events (%d committed) in %v", n, len(committed), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	children := make([]child, procs)
	startChild := func(i int) {
		c := child{cmd: command(), out: &lockedBuffer{}}
		c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
		if err := c.cmd.Start(); err != nil {
			t.Fatalf("start relay process: %v", err)
		}
		children[i] = c
	}
	for i := range procs {
		startChild(i)
	}
	defer func() {
		for _, c := range children {
			if c.cmd.ProcessState == nil {
				_ = c.cmd.Process.Kill()
				_ = c.cmd.Wait()
			}
		}
	}()

	killed := 0
	for killed < kills {
		time.Sleep(time.Duration(100+rand.IntN(200)) * time.Millisecond)
		i := rand.IntN(procs)
		if err := children[i].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = children[i].cmd.Wait()
		killed++
		startChild(i)
	}
	for {
		st := stats(t, ctx, env.Backend)
		if st[outbox.StatePending].Count+st[outbox.StateSending].Count == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("not drained: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(start)
	for i, c := range children {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		// A relay restarted just before the end may get the SIGTERM before
		// it installed its handler; dying of it then is as good a stop.
		if err := c.cmd.Wait(); err != nil && !diedOfSIGTERM(err) {
			t.Errorf("relay process %d: %v\n%s", i, err, c.out.String())
		}
	}

	rec, err := env.Recorded(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent := listPaged(t, ctx, env.Backend, outbox.StateSent, outbox.MaxBatch)
	if len(sent) != len(committed) {
		t.Errorf("%d events sent, %d committed", len(sent), len(committed))
	}
	for _, r := range sent {
		if !committed[r.EventID] {
			t.Errorf("sent event %s was not committed", r.EventID)
		}
	}
	dups := 0
	for id := range committed {
		if rec[id] < 1 {
			t.Errorf("committed event %s never published", id)
		}
		dups += max(rec[id]-1, 0)
	}
	for id, c := range rec {
		if !committed[id] {
			t.Errorf("event %s published %d times but never committed (rolled back: %v)", id, c, rolledBk[id])
		}
	}
	t.Logf("%d committed events published by %d processes x %d loops with %d kills: all at least once, %d duplicate publishes (same ids), none of %d rolled back; %v (%.0f events/s)",
		len(committed), procs, envInt(EnvWorkers, 4), killed, dups, len(rolledBk), elapsed.Round(time.Millisecond), float64(len(committed))/elapsed.Seconds())
}

// ServeRelay is the body of an acceptance relay process: it runs
// IDEM_OUTBOX_WORKERS relay loops whose publisher records each batch with
// env.Record (with short pauses before and after, so that SIGKILLs land
// mid-batch and between the record and the sent mark),
// until SIGTERM. It returns when stopped.
func ServeRelay[Tx any](env Env[Tx]) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	pub := outbox.PublisherFunc(func(ctx context.Context, msgs []outbox.Message) []error {
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		errs := make([]error, len(msgs))
		if err := env.Record(ctx, ids); err != nil {
			for i := range errs {
				errs[i] = err
			}
		}
		// The window between the broker's confirmation and the sent mark,
		// widened so that some kills land in it.
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		return errs
	})
	r, err := outbox.NewRelay(env.Backend, pub, &outbox.Config{
		Workers: envInt(EnvWorkers, 4), BatchSize: 20, Lease: time.Second, PollInterval: 20 * time.Millisecond,
		PurgeInterval: -1, ShutdownTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Retry: &retry.Policy{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: 1000},
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// diedOfSIGTERM reports whether err is a child's exit by SIGTERM's default
// action.
func diedOfSIGTERM(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}
