package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Bounds on the steps of one operation. They are checked before a store
// is touched (the name, the count) or before a result is written (its
// size), each with an error wrapping [ErrInvalidStep].
const (
	// MaxStepNameLen is the longest step name, in bytes. A name is 1 to
	// MaxStepNameLen bytes of ASCII letters, digits and "-_.:".
	MaxStepNameLen = 64
	// MaxSteps is the most steps one operation (scope, key) may record.
	MaxSteps = 64
	// MaxStepResultBytes is the largest step result a store keeps. A
	// larger result of a step on the lease path is recorded as a tombstone
	// (the step is done, its result is not kept); a transactional step
	// with a larger result rolls back.
	MaxStepResultBytes = 64 << 10
)

var (
	// ErrInvalidStep reports a step name outside [MaxStepNameLen] or its
	// charset, an operation that would record more than [MaxSteps] steps,
	// a transactional step whose result exceeds [MaxStepResultBytes], or a
	// step run twice at once.
	ErrInvalidStep = errors.New("idem: invalid step")

	// ErrStepRecorded reports a write of a step that is already recorded
	// for the operation. [Steps.Do] never makes one; a store returns it, and
	// a transactional step rolls its effect back with it.
	ErrStepRecorded = errors.New("idem: step already recorded")

	// ErrStepsUnsupported reports a [Steps] over a store that does not
	// implement [StepStore] (or, for [DoTx], [StepTxStore] with that
	// transaction type), or over a [Run] that did not come from [Guard.Do].
	ErrStepsUnsupported = errors.New("idem: steps are not supported here")
)

// StepRecord is one recorded step of an operation.
type StepRecord struct {
	Scope, Key string
	// Name is the step's name and Seq its place (1, 2, ...) in the order
	// the operation recorded its steps.
	Name string
	Seq  int
	// Fingerprint is the operation's: steps recorded for one request are
	// never handed to another that reuses the key with a different payload.
	Fingerprint Fingerprint
	// Token is the fencing token of the execution that recorded the step.
	Token int64
	// Result is what a resumed execution gets back instead of running the
	// step again (nil for a tombstone).
	Result []byte
	// Tombstone means the result exceeded MaxStepResultBytes and was not
	// kept: the step will not run again and its result cannot be replayed.
	Tombstone bool
	// CreatedAt is when the step was recorded, by the store's clock, and
	// ExpiresAt when the operation's steps may be purged: every step write
	// moves the whole operation's ExpiresAt to now + retention.
	CreatedAt, ExpiresAt time.Time
}

// StepRequest records one completed step under the lease Token.
type StepRequest struct {
	Scope, Key string
	Token      int64
	Name       string
	Result     []byte
	// Tombstone records the step as done without its result.
	Tombstone bool
	// Retention is how long the operation's steps are kept from this write
	// on, by the store's clock. It must be positive.
	Retention time.Duration
}

// StepStore is implemented by stores that record the steps of an
// operation ([Steps]). It is optional: [Store] is unchanged, and a store
// without it makes [Steps.Do] fail with [ErrStepsUnsupported].
//
// Steps are kept apart from the record: they survive Release (a failed
// execution that had recorded steps released its key, and the retry must
// not run those steps again) and a takeover, and expire with their own
// ExpiresAt. Delete removes them with the record; Purge removes expired
// ones. A step whose ExpiresAt has passed counts as absent.
type StepStore interface {
	// RecordStep writes req as one write: it fails with ErrLeaseLost
	// unless req.Token is the current token of a record in progress (as
	// Complete), with ErrStepRecorded when the step is already recorded,
	// and with ErrInvalidStep when the operation has MaxSteps steps or
	// the result is over MaxStepResultBytes. The step takes the record's
	// fingerprint and the next Seq; expired steps of the operation are
	// dropped first, and the others' ExpiresAt moves with the new one's.
	RecordStep(ctx context.Context, req StepRequest) (StepRecord, error)

	// Steps returns the live (unexpired) steps of (scope, key) in Seq
	// order; none is an empty slice, not an error.
	Steps(ctx context.Context, scope, key string) ([]StepRecord, error)
}

// StepTxStore is implemented by the SQL stores for their transaction type
// (*sql.Tx, pgx.Tx): a step whose effect is in the store's database
// commits together with its step record.
type StepTxStore[Tx any] interface {
	StepStore
	// DoStepTx runs fn in a transaction and records its result as the
	// step req.Name (req.Result and req.Tombstone are ignored) in the same
	// transaction, fenced by req.Token as RecordStep is: the effect
	// commits if and only if the lease is still current and the step was
	// not recorded yet. An error from fn, or a result over
	// MaxStepResultBytes, rolls everything back.
	DoStepTx(ctx context.Context, req StepRequest, fn func(ctx context.Context, tx Tx) ([]byte, error)) (StepRecord, error)
}

// ValidateStepName checks a step name: 1 to [MaxStepNameLen] bytes of
// ASCII letters, digits, '-', '_', '.' and ':'.
func ValidateStepName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: step name is empty", ErrInvalidStep)
	}
	if len(name) > MaxStepNameLen {
		return fmt.Errorf("%w: step name is %d bytes, the limit is %d", ErrInvalidStep, len(name), MaxStepNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return fmt.Errorf("%w: step name %q: byte 0x%02x at offset %d is not a letter, digit, '-', '_', '.' or ':'", ErrInvalidStep, name, c, i)
		}
	}
	return nil
}

// ValidateStep checks a StepRequest before a store touches its backend.
func ValidateStep(req StepRequest) error {
	if err := Validate(req.Scope, req.Key); err != nil {
		return err
	}
	if err := ValidateStepName(req.Name); err != nil {
		return err
	}
	if req.Retention <= 0 {
		return fmt.Errorf("%w: step retention must be positive, got %v", ErrInvalidConfig, req.Retention)
	}
	if len(req.Result) > MaxStepResultBytes {
		return StepResultTooLarge(req.Name, len(req.Result))
	}
	if req.Tombstone && req.Result != nil {
		return fmt.Errorf("%w: step %q: a tombstone has no result", ErrInvalidStep, req.Name)
	}
	return nil
}

// StepResultTooLarge is the error for a step result over [MaxStepResultBytes].
func StepResultTooLarge(name string, n int) error {
	return fmt.Errorf("%w: step %q: result is %d bytes, the limit is %d", ErrInvalidStep, name, n, MaxStepResultBytes)
}

// TooManySteps is the error for an operation that already has [MaxSteps] steps.
func TooManySteps(scope, key, name string) error {
	return fmt.Errorf("%w: step %q: operation (scope %q, key %q) already has %d steps, the limit", ErrInvalidStep, name, scope, key, MaxSteps)
}

// StepAlreadyRecorded is the error for a write of a step that is recorded.
func StepAlreadyRecorded(scope, key, name string) error {
	return fmt.Errorf("%w: step %q of (scope %q, key %q)", ErrStepRecorded, name, scope, key)
}

// StepsOfOtherPayload is the error for a step of an operation whose
// recorded steps belong to a different payload (fingerprint): the key was
// released and reused with another request.
func StepsOfOtherPayload(scope, key string) error {
	return fmt.Errorf("%w: (scope %q, key %q) has steps recorded for a different payload", ErrFingerprintMismatch, scope, key)
}

// Step is handed to the function of one step.
type Step struct {
	// Name is the step's name.
	Name string
	// Scope, Key and Token are the operation's and its lease's.
	Scope, Key string
	Token      int64
	// Takeover is true when this execution took over an expired lease: an
	// earlier execution may have started this step and crashed before it
	// was recorded. Foreign calls must carry DownstreamKey for that case.
	Takeover bool
	// DownstreamKey is the idempotency key to send to an external system
	// for this step: the same in every execution of the operation, distinct
	// per step (Run.DownstreamKey(Name)).
	DownstreamKey string
}

// runEnv is what a Run from Guard.Do carries for its steps.
type runEnv struct {
	store     Store
	fp        Fingerprint
	retention time.Duration
	lease     time.Duration
	logger    *slog.Logger
	once      sync.Once
	steps     *Steps
}

// Steps runs the named steps of one operation inside [Guard.Do]: each
// completed step's result is recorded under the operation's (scope, key)
// with the lease's fencing token, so an execution that resumes after a
// crash or a failure (a takeover, or a retry after the key was released)
// gets the recorded results back and never runs a recorded step again.
// These are Brandur Leach's "atomic phases" with recovery points.
//
// A step is either a foreign call ([Steps.Do]: the result is recorded
// after the call, so the call must carry [Step].DownstreamKey for the
// crash between call and record) or a transaction in the store's own
// database ([DoTx]: effect and record commit together).
//
// Get one with [StepsOf] or [StepsFrom]. A Steps is safe for concurrent
// use; running one name twice at once is refused.
type Steps struct {
	run Run
	env *runEnv
	err error

	mu       sync.Mutex
	loaded   bool
	recorded map[string]StepRecord
	running  map[string]bool
	// lost is the ErrLeaseLost a step write got: no step starts after it.
	lost error
}

// StepsOf returns the steps of run, an execution of [Guard.Do]; calls
// with the same run return the same Steps. For a Run that did not come
// from Guard.Do, or over a store without [StepStore], every Do fails with
// an error wrapping [ErrStepsUnsupported].
func StepsOf(run Run) *Steps {
	env := run.env
	if env == nil {
		return &Steps{run: run, err: fmt.Errorf("%w: the Run did not come from Guard.Do", ErrStepsUnsupported)}
	}
	env.once.Do(func() {
		env.steps = &Steps{run: run, env: env, recorded: map[string]StepRecord{}, running: map[string]bool{}}
		if _, ok := env.store.(StepStore); !ok {
			env.steps.err = fmt.Errorf("%w: store %T does not implement idem.StepStore", ErrStepsUnsupported, env.store)
		}
	})
	return env.steps
}

// runKey is the context key of the Run of Guard.Do.
type runKey struct{}

// ContextWithRun returns ctx carrying run. [Guard.Do] gives its function
// such a context; the idemhttp middleware gives it to the handler.
func ContextWithRun(ctx context.Context, run Run) context.Context {
	return context.WithValue(ctx, runKey{}, run)
}

// RunFromContext returns the Run that ctx carries (see [ContextWithRun]).
func RunFromContext(ctx context.Context) (Run, bool) {
	run, ok := ctx.Value(runKey{}).(Run)
	return run, ok
}

// StepsFrom returns the steps of the Run that ctx carries: in a function
// run by [Guard.Do], or in a handler behind the idemhttp middleware.
// Without one, every Do fails with an error wrapping [ErrStepsUnsupported].
func StepsFrom(ctx context.Context) *Steps {
	run, _ := RunFromContext(ctx)
	return StepsOf(run)
}

// Do runs step name once for the operation and returns its result:
//
//   - the step is recorded (by this or an earlier execution): fn does not
//     run and the recorded result is returned (ErrResultDiscarded for a
//     tombstone);
//   - otherwise fn runs; an error from it is returned as it is and nothing
//     is recorded, so a retry of the operation runs the step again;
//   - its result is recorded with the lease's token; a result over
//     [MaxStepResultBytes] is recorded as a tombstone and returned whole.
//     A transient store error is retried while the lease lasts; when the
//     lease is lost or the store stays down, Do returns fn's result with
//     an error wrapping [ErrNotRecorded] (and the cause): the step's effect
//     happened, a retry will run it again with the same DownstreamKey.
//
// ctx should be the context Guard.Do gave its function (or one derived
// from it): once the lease is lost, no further step starts.
func (s *Steps) Do(ctx context.Context, name string, fn func(ctx context.Context, step Step) ([]byte, error)) ([]byte, error) {
	step, rec, done, err := s.begin(ctx, name)
	if err != nil || done {
		return replayStep(rec, err)
	}
	val, err := fn(ctx, step)
	if err != nil {
		s.finish(name, nil)
		return nil, err
	}
	req := s.request(name)
	if len(val) > MaxStepResultBytes {
		s.env.logger.WarnContext(ctx, "idem: step result exceeds the limit; recording a tombstone",
			"scope", s.run.Scope, "key", s.run.Key, "step", name, "bytes", len(val), "limit", MaxStepResultBytes)
		req.Tombstone = true
	} else {
		req.Result = val
	}
	rec, err = s.record(ctx, req)
	s.finish(name, &rec)
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			s.mu.Lock()
			s.lost = err
			s.mu.Unlock()
		}
		return val, fmt.Errorf("%w: step %q: %w", ErrNotRecorded, name, err)
	}
	return val, nil
}

// DoTx runs step name of s in a transaction of the store's database (Tx is
// its transaction type, e.g. *sql.Tx or pgx.Tx): fn's effect and the step
// record commit together, fenced by the lease's token, so the effect
// happens exactly once even across crashes. A recorded step returns its
// result without running fn. An error from fn rolls back and is returned
// wrapped; a lost lease rolls back with an error wrapping ErrLeaseLost;
// an error wrapping ErrCommitUnknown means the commit's answer was lost
// (a retry of the operation finds out whether the step is recorded).
//
// The operation's store must implement [StepTxStore] for Tx.
func DoTx[Tx any](ctx context.Context, s *Steps, name string, fn func(ctx context.Context, tx Tx, step Step) ([]byte, error)) ([]byte, error) {
	var txs StepTxStore[Tx]
	if s.err == nil {
		var ok bool
		if txs, ok = s.env.store.(StepTxStore[Tx]); !ok {
			var tx Tx
			return nil, fmt.Errorf("%w: store %T has no transactional steps with transactions of type %T", ErrStepsUnsupported, s.env.store, tx)
		}
	}
	step, rec, done, err := s.begin(ctx, name)
	if err != nil || done {
		return replayStep(rec, err)
	}
	rec, err = txs.DoStepTx(ctx, s.request(name), func(ctx context.Context, tx Tx) ([]byte, error) {
		return fn(ctx, tx, step)
	})
	if err != nil {
		s.finish(name, nil)
		if errors.Is(err, ErrLeaseLost) {
			s.mu.Lock()
			s.lost = err
			s.mu.Unlock()
		}
		return nil, err
	}
	s.finish(name, &rec)
	return rec.Result, nil
}

// Recorded returns the steps recorded for the operation so far, in order.
func (s *Steps) Recorded(ctx context.Context) ([]StepRecord, error) {
	if s.err != nil {
		return nil, s.err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.load(ctx); err != nil {
		return nil, err
	}
	out := make([]StepRecord, 0, len(s.recorded))
	for _, r := range s.recorded {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b StepRecord) int { return a.Seq - b.Seq })
	return out, nil
}

// begin validates and looks the step up: done with its record when it is
// recorded, or marked running and described by step.
func (s *Steps) begin(ctx context.Context, name string) (step Step, rec StepRecord, done bool, err error) {
	if err := ValidateStepName(name); err != nil {
		return step, rec, false, err
	}
	if s.err != nil {
		return step, rec, false, s.err
	}
	if ctx.Err() != nil {
		return step, rec, false, fmt.Errorf("idem: step %q not started: %w", name, context.Cause(ctx))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost != nil {
		return step, rec, false, fmt.Errorf("idem: step %q not started: %w", name, s.lost)
	}
	if err := s.load(ctx); err != nil {
		return step, rec, false, err
	}
	if rec, ok := s.recorded[name]; ok {
		return step, rec, true, nil
	}
	if s.running[name] {
		return step, rec, false, fmt.Errorf("%w: step %q is already running in this execution", ErrInvalidStep, name)
	}
	if len(s.recorded)+len(s.running) >= MaxSteps {
		return step, rec, false, TooManySteps(s.run.Scope, s.run.Key, name)
	}
	s.running[name] = true
	return Step{
		Name: name, Scope: s.run.Scope, Key: s.run.Key, Token: s.run.Token, Takeover: s.run.Takeover,
		DownstreamKey: s.run.DownstreamKey(name),
	}, rec, false, nil
}

// finish ends a running step, keeping its record if there is one.
func (s *Steps) finish(name string, rec *StepRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.running, name)
	if rec != nil && rec.Name != "" {
		s.recorded[name] = *rec
	}
}

// load reads the recorded steps once; s.mu is held.
func (s *Steps) load(ctx context.Context) error {
	if s.loaded {
		return nil
	}
	recs, err := s.env.store.(StepStore).Steps(ctx, s.run.Scope, s.run.Key)
	if err != nil {
		return fmt.Errorf("idem: reading the recorded steps: %w", err)
	}
	for _, r := range recs {
		if r.Fingerprint != s.env.fp {
			return StepsOfOtherPayload(s.run.Scope, s.run.Key)
		}
		s.recorded[r.Name] = r
	}
	s.loaded = true
	return nil
}

func (s *Steps) request(name string) StepRequest {
	return StepRequest{Scope: s.run.Scope, Key: s.run.Key, Token: s.run.Token, Name: name, Retention: s.env.retention}
}

// record writes req, retrying a transient store error with a growing pause
// for at most one lease. An attempt whose answer was lost may have
// written the step: a retry that finds it recorded (ErrStepRecorded, by
// this token) reads it back.
func (s *Steps) record(ctx context.Context, req StepRequest) (StepRecord, error) {
	ctx = context.WithoutCancel(ctx)
	giveUp := time.Now().Add(s.env.lease)
	pause := 20 * time.Millisecond
	retried := false
	for {
		actx, cancel := context.WithTimeout(ctx, max(s.env.lease/3, time.Second))
		rec, err := s.env.store.(StepStore).RecordStep(actx, req)
		cancel()
		if retried && errors.Is(err, ErrStepRecorded) {
			return s.readBack(ctx, req)
		}
		if err == nil || errors.Is(err, ErrLeaseLost) || !(IsRetryable(err) || errors.Is(err, context.DeadlineExceeded)) ||
			!time.Now().Add(pause).Before(giveUp) {
			return rec, err
		}
		s.env.logger.Warn("idem: recording a step failed; retrying while the lease holds",
			"scope", req.Scope, "key", req.Key, "step", req.Name, "err", err)
		if err := sleep(ctx, pause); err != nil {
			return rec, err
		}
		pause, retried = min(2*pause, time.Second), true
	}
}

// readBack returns the step req wrote in an attempt whose answer was lost.
func (s *Steps) readBack(ctx context.Context, req StepRequest) (StepRecord, error) {
	recs, err := s.env.store.(StepStore).Steps(ctx, req.Scope, req.Key)
	if err != nil {
		return StepRecord{}, err
	}
	for _, r := range recs {
		if r.Name == req.Name && r.Token == req.Token && bytes.Equal(r.Result, req.Result) {
			return r, nil
		}
	}
	return StepRecord{}, StepAlreadyRecorded(req.Scope, req.Key, req.Name)
}

// replayStep turns a recorded step into Do's return values.
func replayStep(rec StepRecord, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	if rec.Tombstone {
		return nil, fmt.Errorf("%w: step %q of (scope %q, key %q)", ErrResultDiscarded, rec.Name, rec.Scope, rec.Key)
	}
	return rec.Result, nil
}
