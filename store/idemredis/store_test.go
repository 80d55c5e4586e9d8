package idemredis_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

// redisURL returns IDEM_REDIS_URL, skipping locally and failing in CI when
// it is not set.
func redisURL(t testing.TB) string {
	t.Helper()
	return idemtest.ServiceURL(t, "IDEM_REDIS_URL")
}

// newClient opens a client on IDEM_REDIS_URL, closed when t ends.
func newClient(t testing.TB) rueidis.Client {
	t.Helper()
	opt, err := rueidis.ParseURL(redisURL(t))
	if err != nil {
		t.Fatalf("IDEM_REDIS_URL: %v", err)
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("connect to Redis: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// randomPrefix returns a key prefix of its own for one test and deletes
// every key under it when the test ends.
func randomPrefix(t testing.TB, c rueidis.Client) string {
	t.Helper()
	var b [8]byte
	_, _ = rand.Read(b[:])
	prefix := "idemtest:" + hex.EncodeToString(b[:]) + ":"
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	return prefix
}

// deletePrefix removes every key starting with prefix on every master.
func deletePrefix(t testing.TB, c rueidis.Client, prefix string) {
	ctx := context.Background()
	for addr, node := range c.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				// Replicas in a cluster answer SCAN too; a failing node is
				// only a cleanup problem.
				t.Logf("cleanup SCAN on %s: %v", addr, err)
				break
			}
			// One DEL per key, pipelined: a cluster client routes each by slot.
			cmds := make(rueidis.Commands, 0, len(e.Elements))
			for _, k := range e.Elements {
				cmds = append(cmds, c.B().Del().Key(k).Build())
			}
			for i, r := range c.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					t.Logf("cleanup DEL %s: %v", e.Elements[i], err)
				}
			}
			if e.Cursor == 0 {
				break
			}
			cursor = e.Cursor
		}
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newStore returns a store over its own random prefix.
func newStore(t testing.TB, c rueidis.Client, cfg *idemredis.Config) *idemredis.Store {
	t.Helper()
	var conf idemredis.Config
	if cfg != nil {
		conf = *cfg
	}
	conf.Prefix = randomPrefix(t, c)
	if conf.Logger == nil {
		conf.Logger = quietLogger()
	}
	s, err := idemredis.New(c, &conf)
	if err != nil {
		t.Fatalf("idemredis.New: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	c := newClient(t)
	storetest.Run(t, func(t *testing.T) idem.Store {
		return newStore(t, c, nil)
	}, &storetest.Options{ClockPrecision: time.Millisecond, ExpiresByTTL: true})
}

func TestListConformance(t *testing.T) {
	c := newClient(t)
	storetest.RunList(t, func(t *testing.T) idem.Store { return newStore(t, c, nil) }, &storetest.ListOptions{Unordered: true})
}

func TestConformanceSmallResultLimit(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, &idemredis.Config{MaxResultBytes: 16})
	ctx := context.Background()
	cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "k", Lease: time.Minute})
	if err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("Claim: %v %v", cl.Outcome, err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "s", Key: "k", Token: cl.Token, Result: bytes.Repeat([]byte("x"), 17), Retention: time.Minute}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	r, err := s.Get(ctx, "s", "k")
	if err != nil || !r.Tombstone || r.Result != nil || r.State != idem.StateCompleted {
		t.Fatalf("want a tombstone, got %+v, %v", r, err)
	}
}

// The delimiter tuples of the issue must land on different Redis keys, and
// the record and its token floor must share one hash tag.
func TestKeysDoNotCollide(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	pairs := [][2]string{{"a:b", "c"}, {"a", "b:c"}, {"a", "bc"}, {"ab", "c"}, {"", "a:b:c"}, {"a:b:c", "x"}}
	seen := make(map[string][2]string)
	for _, p := range pairs {
		k := s.RecordKey(p[0], p[1])
		if prev, dup := seen[k]; dup {
			t.Fatalf("(%q, %q) and (%q, %q) map to the same key %s", prev[0], prev[1], p[0], p[1], k)
		}
		seen[k] = p
		// prefix + "{" + hex(SHA-256(len(scope) ‖ scope ‖ len(key) ‖ key)) + "}"
		var b []byte
		b = binary.BigEndian.AppendUint64(b, uint64(len(p[0])))
		b = append(b, p[0]...)
		b = binary.BigEndian.AppendUint64(b, uint64(len(p[1])))
		b = append(b, p[1]...)
		sum := sha256.Sum256(b)
		if want := "{" + hex.EncodeToString(sum[:]) + "}"; !strings.HasSuffix(k, want) || strings.Count(k, "{") != 1 {
			t.Errorf("key of (%q, %q) = %s, want prefix + %s", p[0], p[1], k, want)
		}
	}
	if s.RecordKey("a:b", "c") == s.RecordKey("a", "b:c") {
		t.Fatal("the colliding-delimiter tuples share a key")
	}

	// And the store keeps them apart end to end.
	ctx := context.Background()
	for _, p := range pairs[:2] {
		cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: p[0], Key: p[1], Lease: time.Minute})
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("Claim(%q, %q): %v %v", p[0], p[1], cl.Outcome, err)
		}
	}
}

func TestPrefixWithBracesRejected(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	for _, p := range []string{"a{b", "a}b", "{x}:"} {
		_, err := idemredis.New(c, &idemredis.Config{Prefix: p, Logger: quietLogger()})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("prefix %q: want ErrInvalidConfig, got %v", p, err)
		}
	}
	if _, err := idemredis.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("nil client: want ErrInvalidConfig, got %v", err)
	}
}

// 64 goroutines claim one key at once, again and again, each winner
// releasing: exactly one holder at a time and strictly increasing tokens.
func TestConcurrentClaimsOneKey(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	const workers, rounds = 64, 20
	var last int64
	for round := range rounds {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []int64
			gate    = make(chan struct{})
			errs    = make(chan error, workers)
		)
		for range workers {
			wg.Go(func() {
				<-gate
				cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "race", Key: "one", Lease: time.Minute})
				if err != nil {
					errs <- err
					return
				}
				if cl.Outcome == idem.Acquired {
					mu.Lock()
					winners = append(winners, cl.Token)
					mu.Unlock()
				} else if cl.Outcome != idem.InProgress {
					errs <- fmt.Errorf("outcome %v", cl.Outcome)
				}
			})
		}
		close(gate)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d goroutines acquired the key, want exactly 1", round, len(winners))
		}
		if winners[0] <= last {
			t.Fatalf("round %d: token %d is not greater than the previous %d", round, winners[0], last)
		}
		last = winners[0]
		// Alternate Release and Delete: tokens must keep increasing across both.
		if round%2 == 0 {
			err := s.Release(ctx, "race", "one", last)
			if err != nil {
				t.Fatalf("Release: %v", err)
			}
		} else if err := s.Delete(ctx, "race", "one"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
}

// Tokens are Redis-clock microseconds, so they keep increasing even when the
// stub of a deleted record is gone (as after a failover that lost it).
func TestTokensIncreaseWithoutFloor(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	req := idem.ClaimRequest{Scope: "floor", Key: "k", Lease: time.Minute}
	var last int64
	for i := range 5 {
		cl, err := s.Claim(ctx, req)
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("Claim %d: %v %v", i, cl.Outcome, err)
		}
		if cl.Token <= last {
			t.Fatalf("token %d after %d", cl.Token, last)
		}
		last = cl.Token
		if err := s.Delete(ctx, "floor", "k"); err != nil {
			t.Fatal(err)
		}
		if err := c.Do(ctx, c.B().Del().Key(s.RecordKey("floor", "k")).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// Records carry Redis's own TTL: completed ones expire after their
// retention, in-progress ones after lease + AbandonedRetention.
func TestRedisTTL(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, &idemredis.Config{AbandonedRetention: time.Hour})
	ctx := context.Background()
	pttl := func(k string) time.Duration {
		t.Helper()
		ms, err := c.Do(ctx, c.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(ms) * time.Millisecond
	}
	cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "ttl", Key: "k", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rk := s.RecordKey("ttl", "k")
	if d := pttl(rk); d < time.Hour || d > time.Hour+time.Minute {
		t.Errorf("in-progress record PTTL %v, want about lease + AbandonedRetention = 1h1m", d)
	}
	r, err := s.Get(ctx, "ttl", "k")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.ExpiresAt.Sub(r.LeaseExpiresAt); got != time.Hour {
		t.Errorf("in-progress ExpiresAt - LeaseExpiresAt = %v, want AbandonedRetention", got)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "ttl", Key: "k", Token: cl.Token, Retention: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if d := pttl(rk); d < 9*time.Minute || d > 10*time.Minute {
		t.Errorf("completed record PTTL %v, want the retention 10m", d)
	}
	// One key per record: nothing else shares its hash tag.
	if keys, err := c.Do(ctx, c.B().Keys().Pattern(rk+"*").Build()).AsStrSlice(); err != nil || len(keys) != 1 {
		t.Errorf("keys of one record: %v %v, want just %s", keys, err, rk)
	}
	if err := s.Delete(ctx, "ttl", "k"); err != nil {
		t.Fatal(err)
	}
	// The deleted record leaves a stub with its token, for an hour at most,
	// that reads as absent.
	if d := pttl(rk); d <= 0 || d > time.Hour {
		t.Errorf("stub PTTL after Delete is %v, want at most an hour", d)
	}
	if _, err := s.Get(ctx, "ttl", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get of a deleted record: want ErrNotFound, got %v", err)
	}
	if err := s.Delete(ctx, "ttl", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Delete of a deleted record: want ErrNotFound, got %v", err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "ttl", Key: "k", Token: cl.Token, Retention: time.Minute}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Complete after Delete: want ErrLeaseLost, got %v", err)
	}
	again, err := s.Claim(ctx, idem.ClaimRequest{Scope: "ttl", Key: "k", Lease: time.Minute})
	if err != nil || again.Outcome != idem.Acquired || again.Takeover || again.Token <= cl.Token {
		t.Errorf("claim over a stub: want a fresh claim above token %d, got %+v %v", cl.Token, again, err)
	}
}

// A key holding anything this version did not write (a hash record of an
// earlier layout, another format version, a corrupt record) is reported as
// ErrRecordFormat by Get and by every script, and never overwritten; Delete
// removes it.
func TestCorruptRecord(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	// A valid in-progress record to corrupt one field at a time.
	cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "corrupt", Key: "k", Lease: time.Minute})
	if err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("Claim: %v %v", cl.Outcome, err)
	}
	rk := s.RecordKey("corrupt", "k")
	good, err := c.Do(ctx, c.B().Get().Key(rk).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	patch := func(at int, with string) string { return good[:at] + with + good[at+len(with):] }
	strs := map[string]string{
		"version":      patch(0, "2"),
		"state":        patch(1, "q"),
		"flag":         patch(2, "7"),
		"token":        patch(4, "00000000000000000x00"),
		"time":         patch(40, "soon"),
		"lengths":      patch(120, "0999"),
		"short":        good[:60],
		"tiny":         "1p",
		"empty":        "",
		"plain string": "hello, world, this is not a record at all",
	}
	check := func(what string) {
		t.Helper()
		if _, err := s.Get(ctx, "corrupt", "k"); !errors.Is(err, idemredis.ErrRecordFormat) {
			t.Errorf("%s: Get returned %v, want ErrRecordFormat", what, err)
		}
		before, _ := c.Do(ctx, c.B().Dump().Key(rk).Build()).ToString()
		if _, err := s.Claim(ctx, idem.ClaimRequest{Scope: "corrupt", Key: "k", Lease: time.Minute}); !errors.Is(err, idemredis.ErrRecordFormat) &&
			!strings.Contains(what, "in-format") {
			t.Errorf("%s: Claim returned %v, want ErrRecordFormat", what, err)
		}
		after, _ := c.Do(ctx, c.B().Dump().Key(rk).Build()).ToString()
		if before != after {
			t.Errorf("%s: Claim changed the value", what)
		}
	}
	for what, v := range strs {
		do(t, c, c.B().Set().Key(rk).Value(v).Build())
		check(what)
		if what == "version" || what == "plain string" || what == "tiny" || what == "empty" {
			// Claim, Complete, Extend and Release never touch it either.
			for name, err := range map[string]error{
				"Complete": s.Complete(ctx, idem.CompleteRequest{Scope: "corrupt", Key: "k", Token: cl.Token, Retention: time.Minute}),
				"Release":  s.Release(ctx, "corrupt", "k", cl.Token),
			} {
				if !errors.Is(err, idemredis.ErrRecordFormat) {
					t.Errorf("%s: %s returned %v, want ErrRecordFormat", what, name, err)
				}
			}
			if _, err := s.Extend(ctx, "corrupt", "k", cl.Token, time.Minute); !errors.Is(err, idemredis.ErrRecordFormat) {
				t.Errorf("%s: Extend returned %v, want ErrRecordFormat", what, err)
			}
		}
	}
	// A hash, as earlier development versions wrote.
	do(t, c, c.B().Del().Key(rk).Build())
	do(t, c, c.B().Hset().Key(rk).FieldValue().FieldValue("st", "p").FieldValue("tok", "1").Build())
	check("hash")
	for name, err := range map[string]error{
		"Complete": s.Complete(ctx, idem.CompleteRequest{Scope: "corrupt", Key: "k", Token: cl.Token, Retention: time.Minute}),
		"Release":  s.Release(ctx, "corrupt", "k", cl.Token),
	} {
		if !errors.Is(err, idemredis.ErrRecordFormat) {
			t.Errorf("hash: %s returned %v, want ErrRecordFormat", name, err)
		}
	}
	// Delete is the way out, and the key is then free.
	if err := s.Delete(ctx, "corrupt", "k"); err != nil {
		t.Fatalf("Delete of a hash: %v", err)
	}
	if _, err := s.Get(ctx, "corrupt", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get after deleting a bad record: want ErrNotFound, got %v", err)
	}
	next, err := s.Claim(ctx, idem.ClaimRequest{Scope: "corrupt", Key: "k", Lease: time.Minute})
	if err != nil || next.Outcome != idem.Acquired || next.Token <= cl.Token {
		t.Errorf("Claim after deleting a bad record: %+v %v", next, err)
	}
}

// Transport failures are retryable: nothing was recorded.
func TestClosedClientIsRetryable(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	c.Close()
	_, err := s.Claim(context.Background(), idem.ClaimRequest{Scope: "s", Key: "k", Lease: time.Minute})
	if err == nil || !idem.IsRetryable(err) {
		t.Fatalf("Claim on a closed client: want a retryable error, got %v", err)
	}
	for name, err := range map[string]error{
		"Complete": s.Complete(context.Background(), idem.CompleteRequest{Scope: "s", Key: "k", Token: 1, Retention: time.Minute}),
		"Release":  s.Release(context.Background(), "s", "k", 1),
		"Delete":   s.Delete(context.Background(), "s", "k"),
	} {
		if !idem.IsRetryable(err) {
			t.Errorf("%s on a closed client: want a retryable error, got %v", name, err)
		}
	}
	if _, err := s.Extend(context.Background(), "s", "k", 1, time.Minute); !idem.IsRetryable(err) {
		t.Errorf("Extend on a closed client: want a retryable error, got %v", err)
	}
	if _, err := s.Get(context.Background(), "s", "k"); !idem.IsRetryable(err) {
		t.Errorf("Get on a closed client: want a retryable error, got %v", err)
	}
}

func TestPurgeIsNoop(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	if n, err := s.Purge(context.Background(), 0); n != 0 || err != nil {
		t.Errorf("Purge: %d, %v; want 0, nil", n, err)
	}
	if _, err := s.Purge(context.Background(), -1); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("Purge(-1): want ErrInvalidConfig, got %v", err)
	}
	if !s.Durable() {
		t.Error("Durable() = false")
	}
}

// What the skipped Purge conformance checks want, minus the count: records
// past their retention are gone without any Purge, the others stay, and a
// new claim gets a greater token without a takeover.
func TestExpiredRecordsAreGone(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := context.Background()
	claimDone := func(key string, retention time.Duration) int64 {
		t.Helper()
		cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "exp", Key: key, Lease: time.Minute})
		if err != nil || cl.Outcome != idem.Acquired {
			t.Fatalf("Claim(%s): %v %v", key, cl.Outcome, err)
		}
		if err := s.Complete(ctx, idem.CompleteRequest{Scope: "exp", Key: key, Token: cl.Token, Retention: retention}); err != nil {
			t.Fatal(err)
		}
		return cl.Token
	}
	old := claimDone("short", 300*time.Millisecond)
	claimDone("long", time.Hour)
	live, err := s.Claim(ctx, idem.ClaimRequest{Scope: "exp", Key: "live", Lease: time.Minute})
	if err != nil || live.Outcome != idem.Acquired {
		t.Fatalf("Claim(live): %v %v", live.Outcome, err)
	}
	time.Sleep(400 * time.Millisecond)
	if _, err := s.Get(ctx, "exp", "short"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get of a record past its retention: want ErrNotFound, got %v", err)
	}
	if r, err := s.Get(ctx, "exp", "long"); err != nil || r.State != idem.StateCompleted {
		t.Errorf("Get of a kept record: %+v %v", r, err)
	}
	if r, err := s.Get(ctx, "exp", "live"); err != nil || r.State != idem.StateInProgress {
		t.Errorf("Get of a live record: %+v %v", r, err)
	}
	if n, err := s.Purge(ctx, 2); n != 0 || err != nil {
		t.Errorf("Purge: %d %v", n, err)
	}
	cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "exp", Key: "short", Lease: time.Minute})
	if err != nil || cl.Outcome != idem.Acquired || cl.Takeover || cl.Token <= old {
		t.Errorf("claim after expiry: want a fresh claim with a token above %d, got %+v %v", old, cl, err)
	}
}
