package idemredis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

// busyScript keeps Redis busy for ARGV[1] microseconds: no other command
// runs meanwhile, so the claims sent in that time pile up.
const busyScript = `
local s = redis.call('TIME')
local t0 = s[1] * 1000000 + s[2]
repeat
  local n = redis.call('TIME')
until n[1] * 1000000 + n[2] - t0 >= tonumber(ARGV[1])
return 1
`

// blockRedis runs busyScript for d on a connection of its own and returns
// once the server has stopped answering, with a channel closed when the
// script ends.
func blockRedis(t *testing.T, addr string, d time.Duration) <-chan struct{} {
	t.Helper()
	blocker, probe := clientAt(t, addr), clientAt(t, addr) // both connected before the block
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := blocker.Do(context.Background(), blocker.B().Eval().Script(busyScript).Numkeys(0).Arg(fmt.Sprint(d.Microseconds())).Build()).Error()
		if err != nil {
			t.Errorf("busy script: %v", err)
		}
	}()
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := probe.Do(ctx, probe.B().Ping().Build()).Error()
		cancel()
		if err != nil { // a timeout, as a context or a connection error
			return done
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the busy script did not block the server")
	return nil
}

// privateStore returns a store, its client and the address of a private
// server of its own, which a test may block.
func privateStore(t *testing.T) (string, rueidis.Client, *idemredis.Store) {
	t.Helper()
	addr := startRedis(t)
	c := clientAt(t, addr)
	return addr, c, newStore(t, c, nil)
}

// scriptCalls returns how many EVALSHA and EVAL calls the server has run.
func scriptCalls(t *testing.T, c rueidis.Client) int {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				var calls int
				if _, err := fmt.Sscanf(rest, "calls=%d", &calls); err != nil {
					t.Fatalf("commandstats line %q: %v", line, err)
				}
				n += calls
			}
		}
	}
	return n
}

// TestConcurrentClaimsShareCalls: claims made while the server is busy go
// out together, each with its own outcome, lease and record: distinct keys
// with two different leases, and one key claimed by eight callers at once.
func TestConcurrentClaimsShareCalls(t *testing.T) {
	t.Parallel()
	addr, c, s := privateStore(t)
	ctx := context.Background()
	do(t, c, c.B().ConfigResetstat().Build())

	const distinct, same = 64, 8
	type result struct {
		key   string
		lease time.Duration
		claim idem.Claim
		err   error
	}
	results := make([]result, distinct+same)
	for i := range results {
		results[i].key, results[i].lease = fmt.Sprintf("k%d", i), time.Minute
		if i%2 == 1 {
			results[i].lease = 2 * time.Minute
		}
		if i >= distinct {
			results[i].key, results[i].lease = "same", time.Minute
		}
	}
	unblocked := blockRedis(t, addr, 300*time.Millisecond)
	before := time.Now()
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			r := &results[i]
			r.claim, r.err = s.Claim(ctx, idem.ClaimRequest{Scope: "batch", Key: r.key, Lease: r.lease})
		})
	}
	wg.Wait()
	after := time.Now()
	<-unblocked

	acquiredSame, inProgressSame := 0, 0
	for _, r := range results {
		if r.err != nil {
			t.Fatalf("claim %s: %v", r.key, r.err)
		}
		if r.key == "same" {
			switch r.claim.Outcome {
			case idem.Acquired:
				acquiredSame++
			case idem.InProgress:
				inProgressSame++
			default:
				t.Errorf("claim of the shared key: outcome %v", r.claim.Outcome)
			}
			continue
		}
		if r.claim.Outcome != idem.Acquired || r.claim.Token <= 0 {
			t.Fatalf("claim %s: %+v, want acquired with a token", r.key, r.claim)
		}
		le := r.claim.LeaseExpiresAt
		if le.Before(before.Add(r.lease-time.Second)) || le.After(after.Add(r.lease+time.Second)) {
			t.Errorf("claim %s with lease %v: lease expires at %v, want between %v and %v", r.key, r.lease, le, before.Add(r.lease), after.Add(r.lease))
		}
		rec, err := s.Get(ctx, "batch", r.key)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateInProgress || rec.Token != r.claim.Token || !rec.LeaseExpiresAt.Equal(le) {
			t.Errorf("record %s: %+v, want in progress with the claim's token %d and lease %v", r.key, rec, r.claim.Token, le)
		}
	}
	if acquiredSame != 1 || inProgressSame != same-1 {
		t.Errorf("shared key: %d acquired, %d in progress; want 1 and %d", acquiredSame, inProgressSame, same-1)
	}
	// Two calls were in flight when the server blocked; the other claims
	// queued and went out in a few calls of up to 64.
	if calls := scriptCalls(t, c); calls >= len(results)/4 {
		t.Errorf("%d claims took %d script calls; want them batched into fewer than %d", len(results), calls, len(results)/4)
	}
}

// TestClaimItemErrorIsItsOwn: a key that holds a value of another Redis
// type fails its own claim, not the other claims of its call.
func TestClaimItemErrorIsItsOwn(t *testing.T) {
	t.Parallel()
	addr, c, s := privateStore(t)
	ctx := context.Background()
	do(t, c, c.B().Hset().Key(s.RecordKey("batch", "bad")).FieldValue().FieldValue("f", "v").Build())

	keys := []string{"bad"}
	for i := range 31 {
		keys = append(keys, fmt.Sprintf("good%d", i))
	}
	errs := make([]error, len(keys))
	unblocked := blockRedis(t, addr, 200*time.Millisecond)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "batch", Key: k, Lease: time.Minute})
			if err == nil && cl.Outcome != idem.Acquired {
				err = fmt.Errorf("outcome %v", cl.Outcome)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	<-unblocked
	if !errors.Is(errs[0], idemredis.ErrRecordFormat) {
		t.Errorf("claim of a hash key: %v, want ErrRecordFormat", errs[0])
	}
	for i, err := range errs[1:] {
		if err != nil {
			t.Errorf("claim %s: %v", keys[i+1], err)
		}
	}
}

// slowSenders is a client that waits before each command sent without a
// way to cancel it, as batch senders send (their call carries several
// callers' work): a batch stays in flight that long.
type slowSenders struct {
	rueidis.Client
	delay time.Duration
}

func (c slowSenders) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if ctx.Done() == nil {
		time.Sleep(c.delay)
	}
	return c.Client.Do(ctx, cmd)
}

// TestAbandonedClaimsLeaveNoLease: callers that give up while their claims
// wait in the queue get a retryable error, and no key stays in progress: a
// claim still queued is never sent, and the lease of a claim whose batch was
// already sent is released when its reply arrives.
func TestAbandonedClaimsLeaveNoLease(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	c := clientAt(t, addr)
	s := newStore(t, slowSenders{c, 500 * time.Millisecond}, nil)
	ctx := context.Background()

	// Two claims with patient callers, sent alone while the server is
	// busy, take both calls in flight; the others queue behind them.
	patient, cancel := context.WithCancel(ctx) // cancellable: not slowed down
	defer cancel()
	unblocked := blockRedis(t, addr, 300*time.Millisecond)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if _, err := s.Claim(patient, idem.ClaimRequest{Scope: "abandon", Key: fmt.Sprint("patient", i), Lease: time.Hour}); err != nil {
				t.Errorf("patient claim %d: %v", i, err)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)

	// The "queued" callers give up while the server is still busy; the
	// "sent" ones after it is free again, while the sender that took their
	// batch at about 300ms waits 500ms before sending it.
	const n = 5
	errs := make(map[string]error)
	var mu sync.Mutex
	for _, group := range []struct {
		name    string
		timeout time.Duration
	}{{"queued", 100 * time.Millisecond}, {"sent", 500 * time.Millisecond}} {
		for i := range n {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, group.timeout)
				defer cancel()
				key := fmt.Sprint(group.name, i)
				_, err := s.Claim(cctx, idem.ClaimRequest{Scope: "abandon", Key: key, Lease: time.Hour})
				mu.Lock()
				errs[key] = err
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	<-unblocked
	for key, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) || !idem.IsRetryable(err) {
			t.Errorf("claim %s: %v, want a retryable context.DeadlineExceeded", key, err)
		}
	}

	for i := range n {
		// Never sent: the key was never written.
		queued := s.RecordKey("abandon", fmt.Sprint("queued", i))
		if err := c.Do(ctx, c.B().Get().Key(queued).Build()).Error(); !rueidis.IsRedisNil(err) {
			t.Errorf("queued claim %d: key %s: %v, want it never written", i, queued, err)
		}
		// Sent, acquired, then released: the key holds the stub of a
		// released record, and a claim acquires it again.
		key := fmt.Sprint("sent", i)
		deadline := time.Now().Add(5 * time.Second)
		for {
			raw, err := c.Do(ctx, c.B().Get().Key(s.RecordKey("abandon", key)).Build()).ToString()
			if err == nil && strings.HasPrefix(raw, "1x00") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %s holds %q, %v five seconds after its caller gave up; want the stub of a released record", key, raw, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "abandon", Key: key, Lease: time.Hour})
		if err != nil || cl.Outcome != idem.Acquired || cl.Takeover {
			t.Errorf("claim %s after its release: %+v, %v; want a fresh acquire", key, cl, err)
		}
	}
}

// TestClaimsSurviveKilledConnections: when Redis drops every connection,
// a claim sent on a dead connection fails with a retryable error (rueidis
// finds an idle connection dead only when it next uses it, so this can
// happen a while after the kill), and its retry succeeds on a fresh one.
func TestClaimsSurviveKilledConnections(t *testing.T) {
	t.Parallel()
	addr, _, s := privateStore(t)
	admin := clientAt(t, addr)
	ctx := context.Background()

	round := func(name string, retries int) {
		t.Helper()
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Go(func() {
				key := fmt.Sprintf("%s-%d", name, i)
				for attempt := 0; ; attempt++ {
					cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "kill", Key: key, Lease: time.Minute})
					if err == nil && cl.Outcome == idem.Acquired {
						return
					}
					if err != nil && !idem.IsRetryable(err) {
						t.Errorf("%s: %v, want a retryable error", key, err)
						return
					}
					if err == nil && cl.Outcome != idem.InProgress {
						// InProgress: an attempt whose reply was lost did claim it.
						t.Errorf("%s: outcome %v", key, cl.Outcome)
						return
					}
					if err == nil || attempt >= retries {
						if err != nil {
							t.Errorf("%s: still failing after %d retries: %v", key, retries, err)
						}
						return
					}
				}
			})
		}
		wg.Wait()
	}
	round("warm", 0)
	do(t, admin, admin.B().ClientKill().TypeNormal().Build())
	round("after-kill", 3)
	round("settled", 3)
}

// TestConformanceUnbatched runs the suite with every claim on its own call,
// the path a cluster client takes.
func TestConformanceUnbatched(t *testing.T) {
	c := newClient(t)
	storetest.Run(t, func(t *testing.T) idem.Store {
		return newStore(t, c, &idemredis.Config{Coalesce: 1})
	}, &storetest.Options{ClockPrecision: time.Millisecond, ExpiresByTTL: true})
}

// TestConcurrentCompletionsShareCalls: completions made while the server is
// busy go out together, each with its own outcome: the records complete
// with their results, a stale token loses its lease, and a key holding a
// value of another type fails alone.
func TestConcurrentCompletionsShareCalls(t *testing.T) {
	t.Parallel()
	addr, c, s := privateStore(t)
	ctx := context.Background()

	const n = 64
	tokens := make([]int64, n)
	for i := range n {
		cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "complete", Key: fmt.Sprint(i), Lease: time.Minute})
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("claim %d: %+v, %v", i, cl, err)
		}
		tokens[i] = cl.Token
	}
	do(t, c, c.B().Hset().Key(s.RecordKey("complete", "hash")).FieldValue().FieldValue("f", "v").Build())
	do(t, c, c.B().ConfigResetstat().Build())

	errs := make([]error, n)
	var staleErr, hashErr error
	unblocked := blockRedis(t, addr, 300*time.Millisecond)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			errs[i] = s.Complete(ctx, idem.CompleteRequest{Scope: "complete", Key: fmt.Sprint(i), Token: tokens[i],
				Result: []byte(fmt.Sprintf("result %d", i)), Retention: time.Hour})
		})
	}
	wg.Go(func() {
		staleErr = s.Complete(ctx, idem.CompleteRequest{Scope: "complete", Key: "0", Token: tokens[0] - 1, Result: []byte("stale"), Retention: time.Hour})
	})
	wg.Go(func() {
		hashErr = s.Complete(ctx, idem.CompleteRequest{Scope: "complete", Key: "hash", Token: tokens[1], Retention: time.Hour})
	})
	wg.Wait()
	<-unblocked

	if !errors.Is(staleErr, idem.ErrLeaseLost) {
		t.Errorf("complete with a stale token: %v, want ErrLeaseLost", staleErr)
	}
	if !errors.Is(hashErr, idemredis.ErrRecordFormat) {
		t.Errorf("complete of a hash key: %v, want ErrRecordFormat", hashErr)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		rec, err := s.Get(ctx, "complete", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateCompleted || string(rec.Result) != fmt.Sprintf("result %d", i) || rec.Token != tokens[i] {
			t.Errorf("record %d: %+v, want completed with its own result and token %d", i, rec, tokens[i])
		}
	}
	if calls := scriptCalls(t, c); calls >= (n+2)/4 {
		t.Errorf("%d completions took %d script calls; want them batched into fewer than %d", n+2, calls, (n+2)/4)
	}
}
