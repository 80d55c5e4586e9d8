package idemredis_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/faultnet"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

// An OOM write error fails closed: the claim returns ErrOutOfMemory (marked
// retryable), nothing is recorded and a guarded function never runs. Release
// still works, since it frees memory.
func TestOutOfMemoryFailsClosed(t *testing.T) {
	t.Parallel()
	addr := startRedis(t, "--maxmemory-policy", "noeviction")
	c := clientAt(t, addr)
	s, err := idemredis.New(c, &idemredis.Config{Strict: true, Logger: quietLogger()})
	if err == nil {
		err = s.Ping(context.Background())
	}
	if err != nil {
		t.Fatalf("New on a noeviction server in strict mode: %v", err)
	}
	ctx := context.Background()
	held, err := s.Claim(ctx, idem.ClaimRequest{Scope: "oom", Key: "held", Lease: time.Minute})
	if err != nil || held.Outcome != idem.Acquired {
		t.Fatalf("Claim before OOM: %v %v", held.Outcome, err)
	}
	done, err := s.Claim(ctx, idem.ClaimRequest{Scope: "oom", Key: "done", Lease: time.Minute})
	if err != nil || done.Outcome != idem.Acquired {
		t.Fatalf("Claim before OOM: %v %v", done.Outcome, err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "oom", Key: "done", Token: done.Token, Result: []byte("kept"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Put the server over its limit: 1 MiB of data, then maxmemory 1mb
	// (an empty server already uses most of that).
	fill := strings.Repeat("x", 256<<10)
	const fillers = 4
	for i := range fillers {
		do(t, c, c.B().Set().Key("filler:"+strconv.Itoa(i)).Value(fill).Build())
	}
	do(t, c, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "1mb").Build())

	_, err = s.Claim(ctx, idem.ClaimRequest{Scope: "oom", Key: "new", Lease: time.Minute})
	if !errors.Is(err, idemredis.ErrOutOfMemory) || !idem.IsRetryable(err) {
		t.Fatalf("Claim under OOM: want a retryable ErrOutOfMemory, got %v", err)
	}
	// Reading needs no memory: a completed record is still replayed and a
	// live lease still reported.
	if cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "oom", Key: "done", Lease: time.Minute}); err != nil ||
		cl.Outcome != idem.Completed || string(cl.Record.Result) != "kept" {
		t.Fatalf("replay under OOM: %+v %v", cl, err)
	}
	if cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "oom", Key: "held", Lease: time.Minute}); err != nil || cl.Outcome != idem.InProgress {
		t.Fatalf("claim of a held key under OOM: %+v %v", cl, err)
	}
	err = s.Complete(ctx, idem.CompleteRequest{Scope: "oom", Key: "held", Token: held.Token, Result: []byte("r"), Retention: time.Hour})
	if !errors.Is(err, idemredis.ErrOutOfMemory) {
		t.Fatalf("Complete under OOM: want ErrOutOfMemory, got %v", err)
	}
	if _, err := s.Extend(ctx, "oom", "held", held.Token, time.Minute); !errors.Is(err, idemredis.ErrOutOfMemory) {
		t.Fatalf("Extend under OOM: want ErrOutOfMemory, got %v", err)
	}

	ran := false
	_, err = idem.NewGuard(s, &idem.GuardConfig{Logger: quietLogger()}).Do(ctx, idem.Call{Scope: "oom", Key: "guarded"},
		func(context.Context, idem.Run) ([]byte, error) { ran = true; return nil, nil })
	if err == nil || ran {
		t.Fatalf("Guard.Do under OOM: fn ran=%v, err=%v; want an error and no run", ran, err)
	}
	for _, key := range []string{"new", "guarded"} {
		if _, err := s.Get(ctx, "oom", key); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("a claim refused for OOM left a record for %q: %v", key, err)
		}
	}
	if r, err := s.Get(ctx, "oom", "held"); err != nil || r.State != idem.StateInProgress {
		t.Errorf("the refused Complete changed the record: %+v %v", r, err)
	}

	if err := s.Release(ctx, "oom", "held", held.Token); err != nil {
		t.Fatalf("Release under OOM must still work: %v", err)
	}
	do(t, c, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build())
	cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "oom", Key: "held", Lease: time.Minute})
	if err != nil || cl.Outcome != idem.Acquired || cl.Token <= held.Token {
		t.Fatalf("Claim after memory was freed: %+v %v", cl, err)
	}
}

// logSink collects log output; Ping logs from the calling goroutine only.
type logSink struct{ bytes.Buffer }

func TestEvictionPolicyCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	evicting := clientAt(t, startRedis(t, "--maxmemory-policy", "allkeys-lru"))
	var logs logSink
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if err := newAndPing(ctx, evicting, &idemredis.Config{Logger: logger}); err != nil {
		t.Fatalf("Ping on an evicting server without Strict must only warn: %v", err)
	}
	if !strings.Contains(logs.String(), "allkeys-lru") || !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("want a warning naming the policy, got log %q", logs.String())
	}
	if err := newAndPing(ctx, evicting, &idemredis.Config{Strict: true, Logger: logger}); !errors.Is(err, idemredis.ErrEvictionPolicy) {
		t.Errorf("Ping on an evicting server in strict mode: want ErrEvictionPolicy, got %v", err)
	}

	// Managed services often hide CONFIG: unknown is treated like unsafe.
	hidden := clientAt(t, startRedis(t, "--rename-command", "CONFIG", ""))
	logs.Reset()
	if err := newAndPing(ctx, hidden, &idemredis.Config{Logger: logger}); err != nil {
		t.Fatalf("Ping without CONFIG and without Strict must only warn: %v", err)
	}
	if !strings.Contains(logs.String(), "cannot read maxmemory-policy") {
		t.Errorf("want a warning that the policy is unknown, got log %q", logs.String())
	}
	if err := newAndPing(ctx, hidden, &idemredis.Config{Strict: true, Logger: logger}); !errors.Is(err, idemredis.ErrEvictionPolicy) {
		t.Errorf("Ping without CONFIG in strict mode: want ErrEvictionPolicy, got %v", err)
	}
}

// newAndPing is New, which does no I/O, then Ping, which checks the server.
func newAndPing(ctx context.Context, c rueidis.Client, cfg *idemredis.Config) error {
	s, err := idemredis.New(c, cfg)
	if err != nil {
		return err
	}
	return s.Ping(ctx)
}

// New does no I/O, so it succeeds while the server is down; Ping reports it.
func TestPingDeadServer(t *testing.T) {
	t.Parallel()
	relay, err := faultnet.Start(startRedis(t, "--maxmemory-policy", "noeviction"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	c := clientAt(t, relay.Addr())
	s, err := idemredis.New(c, &idemredis.Config{Strict: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping on a live noeviction server: %v", err)
	}
	relay.Set(faultnet.Fault{Refuse: true})
	relay.CloseConns()
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping with the server unreachable: want an error")
	}
	if _, err := idemredis.New(c, nil); err != nil {
		t.Fatalf("New with the server unreachable: %v (it must not touch the server)", err)
	}
}
