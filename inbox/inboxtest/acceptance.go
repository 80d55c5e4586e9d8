package inboxtest

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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/retry"
)

// Environment knobs of the acceptance test, so CI stays fast and a manual
// run can go large (IDEM_INBOX_MESSAGES=50000).
const (
	EnvMessages = "IDEM_INBOX_MESSAGES" // messages received; default 5000 (1000 under -race)
	EnvProcs    = "IDEM_INBOX_PROCS"    // worker processes; default 4
	EnvWorkers  = "IDEM_INBOX_WORKERS"  // worker loops per process; default 8
	EnvKills    = "IDEM_INBOX_KILLS"    // SIGKILL + restart rounds; default 4
	envFailRate = "IDEM_INBOX_FAIL_PERMILLE"
)

// AcceptanceMaxAttempts is the workers' MaxAttempts in the acceptance test.
const AcceptanceMaxAttempts = 3

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type child struct {
	cmd *exec.Cmd
	out *bytes.Buffer
	mu  *sync.Mutex
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 1<<16 {
		return len(p), nil
	}
	return w.buf.Write(p)
}

// RunAcceptance receives N messages, runs them through worker processes
// started with command (each must call [ServeWorker]), SIGKILLs and
// restarts a process several times while they work, and then checks the
// effects table: every processed message has exactly one effect, every dead
// one (after AcceptanceMaxAttempts) none, and no message is lost.
func RunAcceptance[Tx any](t *testing.T, env Env[Tx], command func() *exec.Cmd) {
	defaultN := 5000
	if raceEnabled {
		defaultN = 1000
	}
	n := envInt(EnvMessages, defaultN)
	procs := envInt(EnvProcs, 4)
	kills := envInt(EnvKills, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()

	var wg sync.WaitGroup
	const receivers = 8
	errs := make(chan error, receivers)
	for r := range receivers {
		wg.Go(func() {
			for i := r; i < n; i += receivers {
				m := inbox.Message{Source: "acceptance", ID: fmt.Sprintf("m-%07d", i), Type: "effect", Payload: []byte(strconv.Itoa(i))}
				if _, err := env.Backend.Receive(ctx, m); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("received %d messages in %v", n, time.Since(start).Round(time.Millisecond))

	children := make([]child, procs)
	startChild := func(i int) {
		c := child{cmd: command(), out: &bytes.Buffer{}, mu: &sync.Mutex{}}
		c.cmd.Stdout = lockedWriter{c.mu, c.out}
		c.cmd.Stderr = lockedWriter{c.mu, c.out}
		if err := c.cmd.Start(); err != nil {
			t.Fatalf("start worker process: %v", err)
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
	workStart := time.Now()
	killed := 0
	for killed < kills {
		time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond)
		st := stats(t, ctx, env.Backend)
		if st[inbox.StatePending].Count+st[inbox.StateRunning].Count == 0 {
			break
		}
		i := rand.IntN(procs)
		if err := children[i].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = children[i].cmd.Wait()
		killed++
		startChild(i)
	}
	t.Logf("SIGKILLed and restarted %d worker processes", killed)
	for {
		st := stats(t, ctx, env.Backend)
		if st[inbox.StatePending].Count+st[inbox.StateRunning].Count == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("not drained: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	elapsed := time.Since(workStart)
	for i, c := range children {
		// A process restarted just before the drain may not yet handle
		// SIGTERM, and would die of it instead of stopping.
		for ready := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			c.mu.Lock()
			up := strings.Contains(c.out.String(), workerReady)
			c.mu.Unlock()
			if up {
				break
			}
			if time.Now().After(ready) {
				t.Errorf("worker process %d did not start within a minute", i)
				break
			}
		}
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		if err := c.cmd.Wait(); err != nil {
			c.mu.Lock()
			t.Errorf("worker process %d: %v\n%s", i, err, c.out.String())
			c.mu.Unlock()
		}
	}

	eff := effects(t, ctx, env)
	states := map[inbox.State][]inbox.Row{}
	for _, st := range []inbox.State{inbox.StateProcessed, inbox.StateDead, inbox.StatePending, inbox.StateRunning} {
		var after int64
		for {
			rows, err := env.Backend.List(ctx, inbox.ListRequest{State: st, AfterID: after, Limit: inbox.MaxBatch})
			if err != nil {
				t.Fatal(err)
			}
			states[st] = append(states[st], rows...)
			if len(rows) < inbox.MaxBatch {
				break
			}
			after = rows[len(rows)-1].ID
		}
	}
	processed, dead := states[inbox.StateProcessed], states[inbox.StateDead]
	if len(processed)+len(dead) != n {
		t.Fatalf("%d processed + %d dead != %d received (pending %d, running %d): messages lost",
			len(processed), len(dead), n, len(states[inbox.StatePending]), len(states[inbox.StateRunning]))
	}
	twice := 0
	for _, r := range processed {
		if c := eff[r.MessageID]; c != 1 {
			t.Errorf("processed message %s has %d effects, want exactly 1", r.MessageID, c)
			twice++
		}
	}
	for _, r := range dead {
		if c := eff[r.MessageID]; c != 0 {
			t.Errorf("dead message %s has %d effects, want 0", r.MessageID, c)
		}
		if r.Attempts != AcceptanceMaxAttempts || r.DeadReason == "" {
			t.Errorf("dead message %s: attempts %d, reason %q", r.MessageID, r.Attempts, r.DeadReason)
		}
	}
	total := 0
	for _, c := range eff {
		total += c
	}
	if total != len(processed) {
		t.Errorf("%d effects for %d processed messages", total, len(processed))
	}
	t.Logf("%d messages, %d processes x %d workers, %d kills: %d processed exactly once, %d dead after %d attempts, %d duplicated; %v (%.0f msg/s)",
		n, procs, envInt(EnvWorkers, 8), killed, len(processed), len(dead), AcceptanceMaxAttempts, twice,
		elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
}

// workerReady is the line ServeWorker prints once SIGTERM stops it
// gracefully.
const workerReady = "inboxtest: worker ready"

// ServeWorker is the body of an acceptance worker process: it runs
// IDEM_INBOX_WORKERS worker loops whose handler writes the effect and then
// fails at random (5%), until SIGTERM. It returns when stopped.
func ServeWorker[Tx any](env Env[Tx]) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Println(workerReady) // SIGTERM now stops it gracefully
	failPermille := envInt(envFailRate, 50)
	w, err := inbox.NewWorker(env.Backend, &inbox.Config{
		Workers: envInt(EnvWorkers, 8), BatchSize: 10, Lease: time.Second, PollInterval: 20 * time.Millisecond,
		PurgeInterval: -1, ShutdownTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler),
		Retry: &retry.Policy{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: AcceptanceMaxAttempts},
	})
	if err != nil {
		return err
	}
	err = w.Handle("effect", func(ctx context.Context, tx Tx, m inbox.Message) error {
		if err := env.Effect(ctx, tx, m.ID); err != nil {
			return err
		}
		if rand.IntN(1000) < failPermille {
			return errors.New("random failure")
		}
		return nil
	})
	if err != nil {
		return err
	}
	return w.Run(ctx)
}
