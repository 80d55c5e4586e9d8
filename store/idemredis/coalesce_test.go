package idemredis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

// TestCoalescedClaimOutcomes: 64 callers whose claims share script calls
// meet every state a key can be in, and each gets the outcome it would have
// got alone: a completed record replayed with its result, a record in
// progress, a fingerprint mismatch, and fresh keys claimed by four callers
// each, of which exactly one acquires and the others see its record.
func TestCoalescedClaimOutcomes(t *testing.T) {
	t.Parallel()
	addr, c, s := privateStore(t)
	ctx := context.Background()

	const keys = 8
	tokens := map[string]int64{}
	for i := range keys {
		for _, prefix := range []string{"done", "held", "other"} {
			key := fmt.Sprint(prefix, i)
			cl, err := s.Claim(ctx, batchReq(key, "a", time.Hour))
			if err != nil || cl.Outcome != idem.Acquired {
				t.Fatalf("claim %s: %+v, %v", key, cl, err)
			}
			tokens[key] = cl.Token
			if prefix == "held" {
				continue
			}
			if err := s.Complete(ctx, idem.CompleteRequest{Scope: "batch", Key: key, Token: cl.Token, Result: []byte("result " + key),
				Retention: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
	}
	do(t, c, c.B().ConfigResetstat().Build())

	type attempt struct {
		key, body string
		claim     idem.Claim
		err       error
	}
	var attempts []*attempt
	for i := range keys {
		for range 4 {
			attempts = append(attempts, &attempt{key: fmt.Sprint("fresh", i), body: "a"})
		}
		attempts = append(attempts, &attempt{key: fmt.Sprint("done", i), body: "a"}, &attempt{key: fmt.Sprint("done", i), body: "a"},
			&attempt{key: fmt.Sprint("held", i), body: "a"}, &attempt{key: fmt.Sprint("other", i), body: "b"})
	}
	if len(attempts) != 64 {
		t.Fatalf("%d attempts, want 64", len(attempts))
	}
	unblocked := blockRedis(t, addr, 300*time.Millisecond)
	var wg sync.WaitGroup
	for _, a := range attempts {
		wg.Go(func() { a.claim, a.err = s.Claim(ctx, batchReq(a.key, a.body, time.Minute)) })
	}
	wg.Wait()
	<-unblocked

	winners := map[string]int64{}
	for _, a := range attempts {
		if a.err != nil {
			t.Fatalf("claim %s: %v", a.key, a.err)
		}
		if a.claim.Outcome == idem.Acquired {
			if winners[a.key] != 0 {
				t.Errorf("%s acquired twice: tokens %d and %d", a.key, winners[a.key], a.claim.Token)
			}
			winners[a.key] = a.claim.Token
		}
	}
	for _, a := range attempts {
		rec := a.claim.Record
		var want idem.Outcome
		switch a.key[:4] {
		case "fres":
			if a.claim.Outcome == idem.Acquired {
				continue
			}
			want = idem.InProgress
			if rec != nil && rec.Token != winners[a.key] {
				t.Errorf("%s: in progress with token %d, want the winner's %d", a.key, rec.Token, winners[a.key])
			}
		case "done":
			want = idem.Completed
			if rec != nil && (string(rec.Result) != "result "+a.key || rec.Token != tokens[a.key]) {
				t.Errorf("%s: replayed %q with token %d, want its own result and token %d", a.key, rec.Result, rec.Token, tokens[a.key])
			}
		case "held":
			want = idem.InProgress
			if rec != nil && rec.Token != tokens[a.key] {
				t.Errorf("%s: in progress with token %d, want the holder's %d", a.key, rec.Token, tokens[a.key])
			}
		case "othe":
			want = idem.Mismatch
		}
		if a.claim.Outcome != want || rec == nil {
			t.Errorf("%s (body %s): %+v, want %v with the record", a.key, a.body, a.claim, want)
		}
	}
	for i := range keys {
		key := fmt.Sprint("fresh", i)
		if winners[key] == 0 {
			t.Errorf("%s: nobody acquired it", key)
			continue
		}
		rec, err := s.Get(ctx, "batch", key)
		if err != nil || rec.State != idem.StateInProgress || rec.Token != winners[key] {
			t.Errorf("record %s: %+v, %v; want in progress with the winner's token %d", key, rec, err, winners[key])
		}
	}
	if calls := scriptCalls(t, c); calls >= len(attempts)/4 {
		t.Errorf("%d claims took %d script calls; want them to share calls (fewer than %d)", len(attempts), calls, len(attempts)/4)
	}
}

// TestLoneCallsGoAlone: a single caller's claims and completions each go
// out at once as a script call of their own (no hand-off to a sender, no
// wait), and a call whose context has already ended sends nothing.
func TestLoneCallsGoAlone(t *testing.T) {
	t.Parallel()
	_, c, s := privateStore(t)
	ctx := context.Background()
	// The first use of each script loads it (NOSCRIPT, then EVAL).
	warm, err := s.Claim(ctx, batchReq("warm", "a", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "batch", Key: "warm", Token: warm.Token, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	do(t, c, c.B().ConfigResetstat().Build())
	const n = 20
	for i := range n {
		key := fmt.Sprint("lone", i)
		cl, err := s.Claim(ctx, batchReq(key, "a", time.Minute))
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("claim %s: %+v, %v", key, cl, err)
		}
		if err := s.Complete(ctx, idem.CompleteRequest{Scope: "batch", Key: key, Token: cl.Token, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if calls := scriptCalls(t, c); calls != 2*n {
		t.Errorf("%d claims and %d completions took %d script calls, want one each", n, n, calls)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Claim(ended, batchReq("never", "a", time.Minute)); !errors.Is(err, context.Canceled) || !idem.IsRetryable(err) {
		t.Errorf("claim with an ended context: %v, want a retryable context.Canceled", err)
	}
	if err := s.Complete(ended, idem.CompleteRequest{Scope: "batch", Key: "lone0", Token: 1, Retention: time.Hour}); !errors.Is(err, context.Canceled) {
		t.Errorf("complete with an ended context: %v, want context.Canceled", err)
	}
	if calls := scriptCalls(t, c); calls != 2*n {
		t.Errorf("calls with an ended context were sent: %d script calls, want %d", calls, 2*n)
	}
	if _, err := s.Get(ctx, "batch", "never"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("key of the cancelled claim: %v, want ErrNotFound", err)
	}
}

// cutProxy forwards TCP connections to a Redis server until told to hold:
// then it forwards no more script calls to the server (counting the calls
// and record keys it swallowed) until cut, which closes every connection
// it has.
type cutProxy struct {
	ln       net.Listener
	target   string
	hold     atomic.Bool
	held     atomic.Int64 // EVALSHA commands swallowed while holding
	heldKeys atomic.Int64 // record keys in them
	mu       sync.Mutex
	conns    []net.Conn
	shutdown chan struct{}
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, shutdown: make(chan struct{})}
	t.Cleanup(func() {
		close(p.shutdown)
		_ = ln.Close()
		p.cut(false)
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(client, server) }()
			go p.forward(server, client)
		}
	}()
	return p
}

// forward copies src to dst, swallowing what arrives while holding.
func (p *cutProxy) forward(dst, src net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			// Only script calls are held: a new connection's handshake
			// goes through.
			if p.hold.Load() && bytes.Contains(buf[:n], []byte("EVALSHA")) {
				p.held.Add(int64(bytes.Count(buf[:n], []byte("EVALSHA"))))
				p.heldKeys.Add(int64(bytes.Count(buf[:n], []byte(idemredis.DefaultPrefix+"{"))))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// cut closes every connection; the later ones are held too with
// keepHolding, else forwarded.
func (p *cutProxy) cut(keepHolding bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.hold.Store(keepHolding)
}

// settle waits until the proxy has held at least calls script calls and
// has held nothing new for 50ms.
func (p *cutProxy) settle(ctx context.Context, t *testing.T, calls int64) {
	t.Helper()
	for held, same := p.held.Load(), 0; held < calls || same < 50; {
		time.Sleep(time.Millisecond)
		if now := p.held.Load(); now != held {
			held, same = now, 0
		} else {
			same++
		}
		if ctx.Err() != nil {
			t.Fatalf("the proxy held %d script calls, want %d", held, calls)
		}
	}
}

// TestGroupTransportError: when the connection breaks while coalesced
// claims are in flight, every member of the lost calls fails with a
// retryable error (as a lone call would), and nothing is lost or half-done:
// their keys were never written, and a retry acquires them afresh.
//
// The proxy swallows the two lone calls that go out first while the
// others queue; cutting the connection fails those two, and their callers'
// slots then send the queue as one call on a new connection, which the
// proxy swallows too; the second cut fails that whole group.
func TestGroupTransportError(t *testing.T) {
	t.Parallel()
	addr := startRedis(t)
	p := startCutProxy(t, addr)
	// AlwaysPipelining: otherwise rueidis sends the first calls on a new
	// connection one at a time, and a second call waits for the held first.
	// PipelineMultiplex -1: one pipelined connection. With two (the default
	// on 2 cores) each call picks one at random; if the lone calls both
	// went on the first, the cut leaves the second dead but not yet known
	// to be, and the group call could fail on it without reaching the
	// proxy, so the proxy never holds it.
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{p.ln.Addr().String()}, DisableRetry: true,
		AlwaysPipelining: true, PipelineMultiplex: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	s, err := idemredis.New(c, &idemredis.Config{Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	admin := clientAt(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if cl, err := s.Claim(ctx, batchReq("warm", "a", time.Minute)); err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("warm-up claim: %+v, %v", cl, err)
	}

	p.hold.Store(true)
	const n = 32
	claims := make([]idem.Claim, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { claims[i], errs[i] = s.Claim(ctx, batchReq(fmt.Sprint("k", i), "a", time.Minute)) })
	}
	p.settle(ctx, t, 2)
	p.cut(true)
	p.settle(ctx, t, 3)
	p.cut(false)
	wg.Wait()

	failed := 0
	for i := range n {
		key := fmt.Sprint("k", i)
		if errs[i] == nil {
			if claims[i].Outcome != idem.Acquired {
				t.Errorf("claim %s: %+v, want acquired", key, claims[i])
			}
			continue
		}
		failed++
		if !idem.IsRetryable(errs[i]) {
			t.Errorf("claim %s: %v, want a retryable error", key, errs[i])
		}
		rk := s.RecordKey("batch", key)
		if exists, err := admin.Do(ctx, admin.B().Exists().Key(rk).Build()).AsInt64(); err != nil || exists != 0 {
			t.Errorf("claim %s failed but its key exists (%d, %v)", key, exists, err)
		}
		cl, err := s.Claim(ctx, batchReq(key, "a", time.Minute))
		if err != nil || cl.Outcome != idem.Acquired || cl.Takeover {
			t.Errorf("retry of %s: %+v, %v; want a fresh acquire", key, cl, err)
		}
	}
	// Every key of a lost call failed, and at least one lost call carried
	// several claims.
	calls, keys := p.held.Load(), p.heldKeys.Load()
	if int64(failed) != keys || keys <= calls {
		t.Errorf("%d script calls with %d keys were lost and %d claims failed; want every key of them failed, in a call of several", calls, keys, failed)
	}
}

// TestClaimCompleteStorm: 64 callers claim and complete 16 keys over and
// over, so claims and completions of the same keys share calls: each key is
// acquired exactly once, its holder's completion succeeds, a stale token is
// refused, and every other claim sees the holder's record, in progress or
// completed with the holder's result.
func TestClaimCompleteStorm(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	const callers, keys, rounds = 64, 16, 20

	var mu sync.Mutex
	winners := map[string]int64{}
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for r := range rounds {
				key := fmt.Sprint("storm", (g+r)%keys)
				cl, err := s.Claim(ctx, batchReq(key, "a", time.Minute))
				if err != nil {
					t.Errorf("claim %s: %v", key, err)
					return
				}
				switch cl.Outcome {
				case idem.Acquired:
					mu.Lock()
					prev := winners[key]
					winners[key] = cl.Token
					mu.Unlock()
					if prev != 0 {
						t.Errorf("%s acquired twice: tokens %d and %d", key, prev, cl.Token)
					}
					stale := s.Complete(ctx, idem.CompleteRequest{Scope: "batch", Key: key, Token: cl.Token - 1, Retention: time.Hour})
					if !errors.Is(stale, idem.ErrLeaseLost) {
						t.Errorf("complete %s with a stale token: %v, want ErrLeaseLost", key, stale)
					}
					if err := s.Complete(ctx, idem.CompleteRequest{Scope: "batch", Key: key, Token: cl.Token,
						Result: []byte(strconv.FormatInt(cl.Token, 10)), Retention: time.Hour}); err != nil {
						t.Errorf("complete %s: %v", key, err)
					}
				case idem.InProgress, idem.Completed:
					rec := cl.Record
					mu.Lock()
					w := winners[key]
					mu.Unlock()
					// The winner is recorded after its claim returns, so a
					// claim in between may see its record first.
					if rec == nil || (w != 0 && rec.Token != w) {
						t.Errorf("claim %s: %v with %+v, want the holder's record (token %d)", key, cl.Outcome, rec, w)
					} else if cl.Outcome == idem.Completed && string(rec.Result) != strconv.FormatInt(rec.Token, 10) {
						t.Errorf("claim %s: replayed %q, want the holder's result %d", key, rec.Result, rec.Token)
					}
				default:
					t.Errorf("claim %s: outcome %v", key, cl.Outcome)
				}
			}
		})
	}
	wg.Wait()
	for i := range keys {
		key := fmt.Sprint("storm", i)
		rec, err := s.Get(ctx, "batch", key)
		if err != nil || rec.State != idem.StateCompleted || rec.Token != winners[key] || string(rec.Result) != strconv.FormatInt(winners[key], 10) {
			t.Errorf("record %s: %+v, %v; want completed by its one holder (token %d)", key, rec, err, winners[key])
		}
	}
}
