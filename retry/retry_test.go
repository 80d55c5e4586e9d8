package retry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

func TestCeiling(t *testing.T) {
	t.Parallel()
	p := &Policy{Base: time.Second, Cap: time.Minute}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60, 60}
	for i, w := range want {
		if got := p.Ceiling(i); got != w*time.Second {
			t.Errorf("Ceiling(%d) = %v, want %v", i, got, w*time.Second)
		}
	}
	if got := p.Ceiling(-3); got != time.Second {
		t.Errorf("Ceiling(-3) = %v, want base", got)
	}
}

func TestCeilingNeverOverflows(t *testing.T) {
	t.Parallel()
	caps := []time.Duration{time.Minute, time.Duration(math.MaxInt64), time.Duration(math.MaxInt64 / 3)}
	for _, c := range caps {
		p := &Policy{Base: 3 * time.Nanosecond, Cap: c, Rand: seeded(1)}
		prev := time.Duration(0)
		for _, a := range []int{0, 1, 30, 61, 62, 63, 64, 100, 1000, math.MaxInt32, math.MaxInt} {
			got := p.Ceiling(a)
			if got <= 0 || got > c || got < prev {
				t.Fatalf("cap %v: Ceiling(%d) = %v (previous %v)", c, a, got, prev)
			}
			prev = got
			for _, j := range []Jitter{FullJitter, EqualJitter, NoJitter} {
				q := *p
				q.Jitter = j
				if d := q.Delay(a); d < 0 || d > got {
					t.Fatalf("cap %v jitter %v: Delay(%d) = %v outside [0, %v]", c, j, a, d, got)
				}
			}
		}
		if got := p.Ceiling(math.MaxInt); got != c {
			t.Fatalf("Ceiling(MaxInt) = %v, want cap %v", got, c)
		}
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	var p *Policy
	q := p.WithDefaults()
	if q.Base != DefaultBase || q.Cap != DefaultCap || q.MaxAttempts != DefaultMaxAttempts || q.Jitter != FullJitter || q.Rand == nil {
		t.Fatalf("defaults = %+v", q)
	}
	if got := (&Policy{Base: time.Hour, Cap: time.Second}).Ceiling(0); got != time.Hour {
		t.Fatalf("cap below base: Ceiling(0) = %v, want the base", got)
	}
	if d := p.Delay(0); d < 0 || d > DefaultBase {
		t.Fatalf("nil policy Delay(0) = %v", d)
	}
}

// TestJitterDistribution checks each strategy's bounds and that full and
// equal jitter are spread over their whole interval (mean and spread close
// to a uniform distribution's).
func TestJitterDistribution(t *testing.T) {
	t.Parallel()
	const n = 20000
	for _, tc := range []struct {
		jitter       Jitter
		lo, hi       float64 // as fractions of the ceiling
		mean, stddev float64
	}{
		{FullJitter, 0, 1, 0.5, 1 / math.Sqrt(12)},
		{EqualJitter, 0.5, 1, 0.75, 0.5 / math.Sqrt(12)},
		{NoJitter, 1, 1, 1, 0},
	} {
		t.Run(tc.jitter.String(), func(t *testing.T) {
			t.Parallel()
			p := &Policy{Base: 100 * time.Millisecond, Cap: 10 * time.Second, Jitter: tc.jitter, Rand: seeded(42)}
			for _, attempt := range []int{0, 3, 20} {
				c := float64(p.Ceiling(attempt))
				var sum, sq float64
				minSeen, maxSeen := math.Inf(1), math.Inf(-1)
				var deciles [10]int
				for range n {
					x := float64(p.Delay(attempt)) / c
					if x < tc.lo || x > tc.hi {
						t.Fatalf("attempt %d: delay fraction %v outside [%v, %v]", attempt, x, tc.lo, tc.hi)
					}
					sum += x
					sq += x * x
					minSeen, maxSeen = min(minSeen, x), max(maxSeen, x)
					if tc.hi > tc.lo {
						deciles[min(int((x-tc.lo)/(tc.hi-tc.lo)*10), 9)]++
					}
				}
				mean := sum / n
				sd := math.Sqrt(sq/n - mean*mean)
				// The standard error of the mean is sd/sqrt(n) < 0.003; allow 0.01.
				if math.Abs(mean-tc.mean) > 0.01 || math.Abs(sd-tc.stddev) > 0.01 {
					t.Errorf("attempt %d: mean %.4f sd %.4f, want %.4f and %.4f", attempt, mean, sd, tc.mean, tc.stddev)
				}
				if tc.hi > tc.lo {
					// Uniform: every tenth of the interval gets ~n/10 draws.
					for i, k := range deciles {
						if math.Abs(float64(k)-n/10) > 0.1*n/10 {
							t.Errorf("attempt %d: decile %d has %d draws, want about %d", attempt, i, k, n/10)
						}
					}
					if minSeen-tc.lo > 0.01 || tc.hi-maxSeen > 0.01 {
						t.Errorf("attempt %d: draws cover [%v, %v], want close to [%v, %v]", attempt, minSeen, maxSeen, tc.lo, tc.hi)
					}
				}
			}
		})
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	cases := []struct {
		err  error
		want Class
	}{
		{nil, ClassSuccess},
		{base, ClassFailure},
		{fmt.Errorf("wrapped: %w", base), ClassFailure},
		{idem.Retryable(base), ClassInfrastructure},
		{fmt.Errorf("x: %w", idem.Retryable(base)), ClassInfrastructure},
		{Permanent(base), ClassPermanent},
		{Permanent(idem.Retryable(base)), ClassPermanent},
		{fmt.Errorf("x: %w", Permanent(base)), ClassPermanent},
		{After(time.Second, base), ClassFailure},
	}
	for _, c := range cases {
		if got := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if Permanent(nil) != nil || After(time.Second, nil) != nil {
		t.Fatal("wrapping nil must return nil")
	}
	if !errors.Is(Permanent(base), base) || !errors.Is(After(1, base), base) {
		t.Fatal("wrappers must unwrap to the original error")
	}
	if Permanent(base).Error() != "boom" || After(1, base).Error() != "boom" {
		t.Fatal("wrappers must keep the message")
	}
	for _, c := range []Class{ClassSuccess, ClassFailure, ClassInfrastructure, ClassPermanent, Class(99)} {
		if c.String() == "" {
			t.Fatal("empty Class string")
		}
	}
	if Jitter(9).String() != "Jitter(9)" {
		t.Fatal(Jitter(9).String())
	}
}

func TestRetryAfterHonoured(t *testing.T) {
	t.Parallel()
	p := &Policy{Base: time.Millisecond, Cap: 10 * time.Millisecond, Rand: seeded(3)}
	err := fmt.Errorf("rate limited: %w", After(time.Minute, errors.New("429")))
	if d, ok := RetryAfter(err); !ok || d != time.Minute {
		t.Fatalf("RetryAfter = %v, %v", d, ok)
	}
	if _, ok := RetryAfter(errors.New("x")); ok {
		t.Fatal("RetryAfter on a plain error")
	}
	for a := range 10 {
		if d := p.DelayFor(a, err); d < time.Minute {
			t.Fatalf("DelayFor(%d) = %v, want at least the Retry-After", a, d)
		}
	}
	if d := p.DelayFor(0, After(0, errors.New("x"))); d > time.Millisecond {
		t.Fatalf("a shorter Retry-After must not lengthen the schedule: %v", d)
	}
	if d, _ := RetryAfter(After(-time.Second, errors.New("x"))); d != 0 {
		t.Fatalf("negative After = %v", d)
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	p := &Policy{Base: time.Second, Cap: 8 * time.Second, MaxAttempts: 3, Jitter: NoJitter}
	boom := errors.New("boom")
	outage := idem.Retryable(errors.New("connection refused"))
	cases := []struct {
		name     string
		p        *Policy
		f        Failures
		err      error
		class    Class
		reason   idem.DeadReason
		delay    time.Duration
		counted  bool
		jittered bool // the delay is drawn from [0, delay]
	}{
		{name: "success", p: p, err: nil, class: ClassSuccess},
		{name: "first failure", p: p, err: boom, class: ClassFailure, delay: time.Second, counted: true},
		{name: "second failure", p: p, f: Failures{Counted: 1}, err: boom, class: ClassFailure, delay: 2 * time.Second, counted: true},
		{name: "max attempts", p: p, f: Failures{Counted: 2}, err: boom, class: ClassFailure, reason: idem.DeadMaxAttempts, counted: true},
		{name: "past max attempts", p: p, f: Failures{Counted: 7}, err: boom, class: ClassFailure, reason: idem.DeadMaxAttempts, counted: true},
		{name: "infrastructure failures grow the backoff", p: p, f: Failures{Counted: 1, Infrastructure: 1}, err: boom, class: ClassFailure, delay: 4 * time.Second, counted: true},
		{name: "infrastructure does not count", p: p, f: Failures{Counted: 2, Infrastructure: 9}, err: outage, class: ClassInfrastructure, delay: 8 * time.Second},
		{name: "permanent", p: p, err: fmt.Errorf("decode: %w", Permanent(boom)), class: ClassPermanent, reason: idem.DeadPermanent, counted: true},
		{name: "permanent outage", p: p, err: Permanent(outage), class: ClassPermanent, reason: idem.DeadPermanent, counted: true},
		{name: "retry-after raises the delay", p: p, err: After(time.Hour, boom), class: ClassFailure, delay: time.Hour, counted: true},
		{name: "retry-after on an outage", p: p, f: Failures{Infrastructure: 3}, err: After(time.Minute, outage), class: ClassInfrastructure, delay: time.Minute},
		{name: "shorter retry-after keeps the schedule", p: p, f: Failures{Counted: 1}, err: After(time.Millisecond, boom), class: ClassFailure, delay: 2 * time.Second, counted: true},
		{name: "retry-after does not outlive max attempts", p: p, f: Failures{Counted: 2}, err: After(time.Hour, boom), class: ClassFailure, reason: idem.DeadMaxAttempts, counted: true},
		{name: "unlimited", p: &Policy{MaxAttempts: -1, Jitter: NoJitter}, f: Failures{Counted: 1000}, err: boom, class: ClassFailure, delay: DefaultCap, counted: true},
		{name: "nil policy retries", p: nil, f: Failures{Counted: DefaultMaxAttempts - 2}, err: boom, class: ClassFailure, delay: 8 * time.Second, counted: true, jittered: true},
		{name: "nil policy gives up at the default", p: nil, f: Failures{Counted: DefaultMaxAttempts - 1}, err: boom, class: ClassFailure, reason: idem.DeadMaxAttempts, counted: true},
	}
	for _, c := range cases {
		d := c.p.Decide(c.f, c.err)
		if d.Class != c.class || d.Reason != c.reason || d.GiveUp() != (c.reason != "") || d.Counted() != c.counted {
			t.Errorf("%s: Decide(%+v, %v) = %+v (give up %v, counted %v)", c.name, c.f, c.err, d, d.GiveUp(), d.Counted())
			continue
		}
		if c.jittered {
			if d.Delay < 0 || d.Delay > c.delay {
				t.Errorf("%s: delay %v outside [0, %v]", c.name, d.Delay, c.delay)
			}
		} else if d.Delay != c.delay {
			t.Errorf("%s: delay %v, want %v", c.name, d.Delay, c.delay)
		}
	}
}

func fast() *Policy {
	return &Policy{Base: time.Microsecond, Cap: 50 * time.Microsecond, MaxAttempts: 3}
}

func TestDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("success after failures", func(t *testing.T) {
		t.Parallel()
		var n int
		err := Do(ctx, fast(), func(context.Context) error {
			n++
			if n < 3 {
				return errors.New("flaky")
			}
			return nil
		})
		if err != nil || n != 3 {
			t.Fatalf("err %v after %d runs", err, n)
		}
	})
	t.Run("exhausted", func(t *testing.T) {
		t.Parallel()
		var n int
		last := errors.New("still failing")
		err := Do(ctx, fast(), func(context.Context) error { n++; return last })
		var ex *ExhaustedError
		if !errors.As(err, &ex) || ex.Attempts != 3 || n != 3 || !errors.Is(err, last) {
			t.Fatalf("err %v after %d runs", err, n)
		}
		if ex.Error() != "retry: gave up after 3 attempts: still failing" {
			t.Fatal(ex.Error())
		}
	})
	t.Run("permanent stops at once", func(t *testing.T) {
		t.Parallel()
		var n int
		perm := Permanent(errors.New("invalid"))
		err := Do(ctx, fast(), func(context.Context) error { n++; return perm })
		if err != perm || n != 1 {
			t.Fatalf("err %v after %d runs", err, n)
		}
	})
	t.Run("infrastructure errors do not count", func(t *testing.T) {
		t.Parallel()
		var n int
		err := Do(ctx, fast(), func(context.Context) error {
			n++
			if n <= 10 {
				return idem.Retryable(errors.New("connection refused"))
			}
			if n <= 12 {
				return errors.New("handler failed")
			}
			return nil
		})
		if err != nil || n != 13 {
			t.Fatalf("err %v after %d runs; 10 outage errors must not exhaust 3 attempts", err, n)
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		t.Parallel()
		var n int
		p := fast()
		p.MaxAttempts = -1
		err := Do(ctx, p, func(context.Context) error {
			if n++; n < 20 {
				return errors.New("x")
			}
			return nil
		})
		if err != nil || n != 20 {
			t.Fatalf("err %v after %d runs", err, n)
		}
	})
	t.Run("retry-after is slept", func(t *testing.T) {
		t.Parallel()
		var n int
		start := time.Now()
		err := Do(ctx, fast(), func(context.Context) error {
			if n++; n == 1 {
				return After(30*time.Millisecond, errors.New("busy"))
			}
			return nil
		})
		if err != nil || time.Since(start) < 30*time.Millisecond {
			t.Fatalf("err %v, elapsed %v", err, time.Since(start))
		}
	})
}

func TestDoContextCancellation(t *testing.T) {
	t.Parallel()
	cause := errors.New("shutting down")
	ctx, cancel := context.WithCancelCause(context.Background())
	var n atomic.Int32
	p := &Policy{Base: time.Hour, Cap: time.Hour, Jitter: NoJitter, MaxAttempts: -1}
	done := make(chan error)
	fail := errors.New("fail")
	go func() { done <- Do(ctx, p, func(context.Context) error { n.Add(1); return fail }) }()
	time.Sleep(20 * time.Millisecond)
	cancel(cause)
	select {
	case err := <-done:
		if !errors.Is(err, cause) || !errors.Is(err, fail) || n.Load() != 1 {
			t.Fatalf("err %v after %d runs", err, n.Load())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Do kept sleeping after the context was cancelled")
	}
	// An already cancelled context does not run fn at all.
	if err := Do(ctx, p, func(context.Context) error { t.Fatal("ran"); return nil }); !errors.Is(err, cause) {
		t.Fatalf("err %v", err)
	}
}

func TestSleep(t *testing.T) {
	start := time.Now()
	if err := Sleep(context.Background(), 20*time.Millisecond); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("Sleep(20ms) = %v after %v; want nil after at least 20ms", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Fatalf("Sleep(1h) on a cancelled context = %v after %v; want context.Canceled at once", err, time.Since(start))
	}
}
