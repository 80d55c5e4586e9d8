package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Environment of the helper process started by TestCrashTakeover.
const (
	envHelper = "IDEMSQLITE_CRASH_HELPER"
	envDB     = "IDEMSQLITE_CRASH_DB"
	envMarker = "IDEMSQLITE_CRASH_MARKER"
)

var crashCall = idem.Call{Scope: "crash", Key: "payment-42", Fingerprint: idem.FingerprintBytes([]byte("charge 42"))}

const crashLease = time.Second

// TestHelperProcess is the worker that gets killed: it claims the key
// through a Guard, writes a marker with its token and blocks before its
// effect, until the parent SIGKILLs it. It does nothing in a normal run.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process for TestCrashTakeover")
	}
	ctx := context.Background()
	s, err := Open(ctx, os.Getenv(envDB), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: open:", err)
		os.Exit(2)
	}
	g := idem.NewGuard(s, &idem.GuardConfig{Lease: crashLease})
	_, err = g.Do(ctx, crashCall, func(ctx context.Context, run idem.Run) ([]byte, error) {
		marker := os.Getenv(envMarker)
		if err := os.WriteFile(marker+".tmp", []byte(strconv.FormatInt(run.Token, 10)), 0o600); err != nil {
			return nil, err
		}
		if err := os.Rename(marker+".tmp", marker); err != nil {
			return nil, err
		}
		<-ctx.Done() // the heartbeat keeps the lease alive until SIGKILL
		return nil, ctx.Err()
	})
	fmt.Fprintln(os.Stderr, "helper: Do returned:", err)
	os.Exit(3)
}

// TestCrashTakeover kills a real process while it holds the lease, then
// checks that the next Guard.Do waits for the lease to expire, takes over
// with a higher token, performs the effect once and completes.
func TestCrashTakeover(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts and kills a child process")
	}
	ctx := context.Background()
	dir := t.TempDir()
	dsn := "sqlite://" + filepath.Join(dir, "crash.db")
	s, err := Open(ctx, dsn, &Config{AutoMigrate: true, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	createEffects(t, s.DB())

	marker := filepath.Join(dir, "started")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envHelper+"=1", envDB+"="+dsn, envMarker+"="+marker)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()

	var childToken int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(marker)
		if err == nil {
			if childToken, err = strconv.ParseInt(string(b), 10, 64); err != nil {
				t.Fatalf("marker %q: %v", b, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child never started its operation; stderr:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Let the child's heartbeat extend the lease at least once, so the
	// survivor has to wait for a lease that a live process was renewing.
	time.Sleep(crashLease / 2)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die of SIGKILL: %v; stderr:\n%s", err, stderr.String())
	}
	killedAt := time.Now()

	rec, err := s.Get(ctx, crashCall.Scope, crashCall.Key)
	if err != nil || rec.State != idem.StateInProgress || rec.Token != childToken {
		t.Fatalf("after the kill the record must be the child's lease: %+v, %v", rec, err)
	}

	// An impatient caller sees the dead child's lease as live.
	if _, err := idem.NewGuard(s, &idem.GuardConfig{Lease: crashLease}).Do(ctx, crashCall, nil); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("Do while the dead child's lease is live: %v, want ErrInProgress", err)
	}

	g := idem.NewGuard(s, &idem.GuardConfig{Lease: crashLease, Wait: 10 * time.Second})
	var got idem.Run
	res, err := g.Do(ctx, crashCall, func(ctx context.Context, run idem.Run) ([]byte, error) {
		got = run
		_, err := s.Process(ctx, idem.Message{Scope: "effects", Key: run.DownstreamKey("charge")}, func(ctx context.Context, tx *sql.Tx) error {
			return insertEffect(ctx, tx, crashCall.Key)
		})
		return []byte("charged"), err
	})
	if err != nil {
		t.Fatalf("survivor Do: %v", err)
	}
	if !got.Takeover || got.Token <= childToken {
		t.Errorf("survivor run = %+v; want Takeover with a token above the child's %d", got, childToken)
	}
	if waited := time.Since(killedAt); waited > 5*time.Second {
		t.Errorf("takeover took %v after the kill; the lease is %v", waited, crashLease)
	}
	if res.Replayed || string(res.Value) != "charged" {
		t.Errorf("survivor result = %+v", res)
	}

	// Every later call replays; the effect exists exactly once.
	again, err := g.Do(ctx, crashCall, func(context.Context, idem.Run) ([]byte, error) {
		t.Error("fn ran again after completion")
		return nil, nil
	})
	if err != nil || !again.Replayed || string(again.Value) != "charged" || again.Token != got.Token {
		t.Errorf("replay = %+v, %v", again, err)
	}
	effects, err := countEffects(ctx, s.DB())
	if err != nil {
		t.Fatal(err)
	}
	if len(effects) != 1 || effects[crashCall.Key] != 1 {
		t.Errorf("effects = %v, want exactly one for %s", effects, crashCall.Key)
	}
}
