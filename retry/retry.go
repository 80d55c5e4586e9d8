package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idem-go/idem"
)

// Jitter is how a [Policy] randomises the exponential delay.
type Jitter int

const (
	// FullJitter draws the delay uniformly from [0, ceiling].
	FullJitter Jitter = iota
	// EqualJitter keeps half of the ceiling and draws the other half:
	// [ceiling/2, ceiling].
	EqualJitter
	// NoJitter always waits the ceiling. Clients that fail together retry
	// together; use it only for comparison.
	NoJitter
)

func (j Jitter) String() string {
	switch j {
	case FullJitter:
		return "full"
	case EqualJitter:
		return "equal"
	case NoJitter:
		return "none"
	}
	return fmt.Sprintf("Jitter(%d)", int(j))
}

// Defaults of a [Policy].
const (
	DefaultBase        = time.Second
	DefaultCap         = time.Minute
	DefaultMaxAttempts = 5
)

// Source is a random source; *math/rand/v2.Rand satisfies it.
type Source interface {
	// Int64N returns a uniform value in [0, n); n > 0.
	Int64N(n int64) int64
}

// globalSource uses math/rand/v2's goroutine-safe global generator.
type globalSource struct{}

func (globalSource) Int64N(n int64) int64 { return rand.Int64N(n) }

// Policy is an exponential backoff schedule. The zero value, and a nil
// *Policy, mean full jitter with the Default constants.
type Policy struct {
	// Base is the ceiling of the first retry's delay. Default 1s.
	Base time.Duration
	// Cap bounds every delay computed from the schedule. Default 1m. A
	// delay requested with [After] may exceed it.
	Cap time.Duration
	// MaxAttempts is how many times an operation runs, the first run
	// included, before it is given up (dead-lettered). Infrastructure errors
	// do not count. Default 5; a negative value means no limit.
	MaxAttempts int
	// Jitter is the randomisation strategy. Default FullJitter.
	Jitter Jitter
	// Rand is the random source. Nil means math/rand/v2's global
	// generator. A source shared by goroutines must be safe for concurrent
	// use (a *rand.Rand is not); tests use a seeded one for repeatability.
	Rand Source
}

// withDefaults returns a copy of p with zero fields filled in.
func (p *Policy) withDefaults() Policy {
	var q Policy
	if p != nil {
		q = *p
	}
	if q.Base <= 0 {
		q.Base = DefaultBase
	}
	if q.Cap <= 0 {
		q.Cap = DefaultCap
	}
	if q.Cap < q.Base {
		q.Cap = q.Base
	}
	if q.MaxAttempts == 0 {
		q.MaxAttempts = DefaultMaxAttempts
	}
	if q.Rand == nil {
		q.Rand = globalSource{}
	}
	return q
}

// WithDefaults returns the policy with every zero field replaced by its
// default. It is safe to call on a nil *Policy.
func (p *Policy) WithDefaults() Policy { return p.withDefaults() }

// Ceiling returns min(Cap, Base·2^attempt), the largest delay the schedule
// allows before the given retry. attempt counts from 0 (the delay after the
// first failure). It never overflows: large attempts return Cap.
func (p *Policy) Ceiling(attempt int) time.Duration {
	q := p.withDefaults()
	return ceiling(q.Base, q.Cap, attempt)
}

func ceiling(base, limit time.Duration, attempt int) time.Duration {
	if attempt < 0 {
		attempt = 0
	}
	// base<<attempt overflows (or passes the cap) exactly when base is
	// larger than cap>>attempt; checking that first avoids the overflow.
	if attempt >= 63 || base > limit>>uint(attempt) {
		return limit
	}
	return base << uint(attempt)
}

// Delay returns the delay before retry number attempt (from 0), drawn with
// the policy's jitter strategy.
func (p *Policy) Delay(attempt int) time.Duration {
	q := p.withDefaults()
	return q.delay(attempt)
}

func (q *Policy) delay(attempt int) time.Duration {
	c := ceiling(q.Base, q.Cap, attempt)
	switch q.Jitter {
	case NoJitter:
		return c
	case EqualJitter:
		half := c / 2
		return half + time.Duration(q.Rand.Int64N(int64(c-half)+1))
	default:
		// The bound is inclusive; only a ceiling of MaxInt64 cannot take +1.
		if c == time.Duration(1<<63-1) {
			return time.Duration(q.Rand.Int64N(int64(c)))
		}
		return time.Duration(q.Rand.Int64N(int64(c) + 1))
	}
}

// DelayFor returns the delay before retry number attempt after err: the
// jittered schedule, raised to the delay requested with [After] if that is
// longer.
func (p *Policy) DelayFor(attempt int, err error) time.Duration {
	q := p.withDefaults()
	return q.delayFor(attempt, err)
}

func (q *Policy) delayFor(attempt int, err error) time.Duration {
	d := q.delay(attempt)
	if ra, ok := RetryAfter(err); ok && ra > d {
		d = ra
	}
	return d
}

// Class is how an error should be handled.
type Class int

const (
	// ClassSuccess: no error.
	ClassSuccess Class = iota
	// ClassFailure: an ordinary failure, retried and counted toward
	// MaxAttempts.
	ClassFailure
	// ClassInfrastructure: a transient infrastructure failure
	// (idem.IsRetryable), retried with backoff but not counted toward
	// MaxAttempts.
	ClassInfrastructure
	// ClassPermanent: a failure marked with [Permanent], never retried.
	ClassPermanent
)

func (c Class) String() string {
	switch c {
	case ClassSuccess:
		return "success"
	case ClassFailure:
		return "failure"
	case ClassInfrastructure:
		return "infrastructure"
	case ClassPermanent:
		return "permanent"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Classify says how err should be handled. Permanent wins over everything,
// so a handler can make an infrastructure error final.
func Classify(err error) Class {
	switch {
	case err == nil:
		return ClassSuccess
	case IsPermanent(err):
		return ClassPermanent
	case idem.IsRetryable(err):
		return ClassInfrastructure
	}
	return ClassFailure
}

// Failures counts an operation's failures before the one being decided.
// Both kinds grow the backoff; only Counted ones count toward MaxAttempts.
type Failures struct {
	// Counted is the number of ordinary failures so far.
	Counted int
	// Infrastructure is the number of infrastructure failures so far
	// (idem.IsRetryable): an outage must not fill the dead letters.
	Infrastructure int
}

// Total is the number of failures of any kind: the backoff exponent.
func (f Failures) Total() int { return f.Counted + f.Infrastructure }

// Decision is what to do after an attempt failed: run it again after
// Delay, or give up (dead-letter it) for Reason.
type Decision struct {
	// Class is the failed attempt's error class.
	Class Class
	// Reason is set when the operation is given up: idem.DeadPermanent or
	// idem.DeadMaxAttempts. Empty means retry.
	Reason idem.DeadReason
	// Delay is the wait before the next attempt, when retrying: the
	// policy's jittered delay, raised to a delay requested with [After].
	Delay time.Duration
}

// GiveUp reports whether the operation must not run again.
func (d Decision) GiveUp() bool { return d.Reason != "" }

// Counted reports whether the failure counts toward MaxAttempts: every
// failure but an infrastructure one.
func (d Decision) Counted() bool { return d.Class != ClassInfrastructure && d.Class != ClassSuccess }

// Decide is the one give-up decision of every consumer, the inbox and [Do]:
// given the failures before the attempt that just failed with err, it says
// whether to retry, and when, or to give up, and why.
//
//   - A [Permanent] error gives up at once with idem.DeadPermanent.
//   - An infrastructure error (idem.IsRetryable) is retried and does not
//     count toward MaxAttempts.
//   - Any other error counts; when it is failure number MaxAttempts (a
//     positive MaxAttempts), Decide gives up with idem.DeadMaxAttempts.
//
// A retry waits [Policy.DelayFor](f.Total(), err). A nil err is
// ClassSuccess: neither a retry nor a give-up. A nil *Policy means the
// defaults.
func (p *Policy) Decide(f Failures, err error) Decision {
	q := p.withDefaults()
	d := Decision{Class: Classify(err)}
	switch d.Class {
	case ClassSuccess:
		return d
	case ClassPermanent:
		d.Reason = idem.DeadPermanent
		return d
	case ClassFailure:
		if q.MaxAttempts > 0 && f.Counted+1 >= q.MaxAttempts {
			d.Reason = idem.DeadMaxAttempts
			return d
		}
	}
	d.Delay = q.delayFor(f.Total(), err)
	return d
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as never worth retrying. It returns nil for a nil err.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, was marked with
// [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type afterError struct {
	d   time.Duration
	err error
}

func (e *afterError) Error() string { return e.err.Error() }
func (e *afterError) Unwrap() error { return e.err }

// After marks err as retryable no sooner than d from now, as an HTTP
// Retry-After asks. A policy's delay is raised to d, even past its Cap. It
// returns nil for a nil err; a negative d counts as zero.
func After(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &afterError{d: max(d, 0), err: err}
}

// RetryAfter returns the delay requested with [After] on err or any error
// it wraps.
func RetryAfter(err error) (time.Duration, bool) {
	var a *afterError
	if errors.As(err, &a) {
		return a.d, true
	}
	return 0, false
}

// ExhaustedError is returned by [Do] when the operation failed MaxAttempts
// times.
type ExhaustedError struct {
	// Attempts is the number of counted failures.
	Attempts int
	// Err is the last error.
	Err error
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("retry: gave up after %d attempts: %v", e.Attempts, e.Err)
}

func (e *ExhaustedError) Unwrap() error { return e.Err }

// Do runs fn until it succeeds, following p (nil means the defaults) and
// [Policy.Decide]: a [Permanent] error is returned at once; an
// infrastructure error (idem.IsRetryable) is retried without counting
// toward MaxAttempts; any other error is retried until MaxAttempts runs
// failed, and then returned in an [*ExhaustedError]. Between runs Do sleeps
// the policy's delay (or longer, for [After]); the exponent grows with
// every failure, counted or not. When ctx ends Do returns its cause joined
// with the last error.
func Do(ctx context.Context, p *Policy, fn func(ctx context.Context) error) error {
	q := p.withDefaults()
	var f Failures
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		err := fn(ctx)
		d := q.Decide(f, err)
		switch {
		case d.Class == ClassSuccess:
			return nil
		case d.Reason == idem.DeadPermanent:
			return err
		case d.GiveUp():
			return &ExhaustedError{Attempts: f.Counted + 1, Err: err}
		case d.Counted():
			f.Counted++
		default:
			f.Infrastructure++
		}
		t := time.NewTimer(d.Delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// Sleep waits d, or until ctx ends, whichever comes first, and returns
// ctx.Err() in the second case: the wait between two attempts.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
