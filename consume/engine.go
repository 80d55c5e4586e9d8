package consume

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/textcut"
	"github.com/idem-go/idem/retry"
)

// Delivery is one message as a broker adapter hands it to the [Engine].
// The engine calls exactly one of Ack, Retry, Requeue or DeadLetter per
// Handle, or none when its context ends first (the broker then redelivers).
type Delivery interface {
	// ID is the producer-assigned message id, "" when there is none.
	// Adapters never use a broker sequence number here.
	ID() string
	// Body is the message payload.
	Body() []byte
	// Origin names where the message was first published, kept in the
	// dead-letter metadata so that it can be redriven there.
	Origin() string
	// State is the retry state the message carries from earlier attempts.
	State() State
	// Ack settles the message as done.
	Ack(ctx context.Context) error
	// Retry arranges for the message to be delivered again, carrying st,
	// no sooner than after, without busy-looping or blocking the broker;
	// the original is settled once the redelivery is safely scheduled.
	Retry(ctx context.Context, after time.Duration, st State) error
	// Requeue hands the message back to the broker unsettled and unchanged
	// (AMQP: nack with requeue; JetStream: nak).
	Requeue(ctx context.Context) error
	// DeadLetter moves the message to the dead letters with dl's metadata
	// and settles the original.
	DeadLetter(ctx context.Context, dl DeadLetter) error
}

// ProcessFunc runs the user's handler for d at most once per msg.Key,
// recording the dedupe record with the effect: typically a closure over a
// SQL store's Process, or [GuardProcess]. It returns idem.Processed,
// idem.Duplicate, or idem.Mismatch (with or without an error wrapping
// idem.ErrFingerprintMismatch); on a handler or store failure it returns
// the error, classified by the retry package's rules. An error wrapping
// idem.ErrCommitUnknown (the commit was sent and its answer lost) is
// neither acked nor counted: the engine hands the delivery back to the
// broker, whose redelivery is deduped.
type ProcessFunc func(ctx context.Context, msg idem.Message, d Delivery) (idem.Outcome, error)

// MissingID says what happens to a message that has no id.
type MissingID int

const (
	// DeadLetterMissingID dead-letters it with reason idem.DeadMissingID:
	// without an id, two publishes of the same event cannot be told from
	// two events with the same content.
	DeadLetterMissingID MissingID = iota
	// ContentKey keys it by the SHA-256 of its body, so identical bodies
	// are duplicates of each other.
	ContentKey
)

// Config configures an [Engine]. A nil *Config, and every zero field,
// means the defaults documented below; only Name is required. Broker
// adapters embed Config in their own configuration, with the same meaning
// for every field, and read the effective values back with [Engine.Config]
// and [Engine.Policy].
type Config struct {
	// Name is the consumer's name: the dedupe scope and the consumer named
	// in dead letters. Required.
	Name string
	// Retry is the backoff policy for failed deliveries; nil means full
	// jitter with the retry package's defaults (MaxAttempts 5).
	Retry *retry.Policy
	// Retention is the dedupe window passed in idem.Message (and, through
	// GuardProcess, in idem.Call). Zero means idem.DefaultRetention.
	Retention time.Duration
	// MissingID is the policy for messages without an id; the zero value
	// is DeadLetterMissingID.
	MissingID MissingID
	// Fingerprint computes a delivery's fingerprint; nil means the SHA-256
	// of the body.
	Fingerprint func(d Delivery) idem.Fingerprint
	// MaxErrorBytes bounds the last error kept in headers. Default 1024.
	MaxErrorBytes int
	// Hooks observe the deliveries: each hook that implements
	// [DeliveryStartHook] or [DeliveryEndHook] (or both) is called for
	// every delivery, in order; other hooks are ignored, so one value
	// (metrics, a tracer) can be given to every component.
	Hooks []idem.Hook
	// Logger receives broker failures. Nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock for failure timestamps; nil means time.Now.
	Now func() time.Time
}

// Engine decides the fate of deliveries. It is safe for concurrent use.
type Engine struct {
	process ProcessFunc
	cfg     Config
	policy  retry.Policy
	starts  []DeliveryStartHook
	ends    []DeliveryEndHook
}

// New returns an Engine that runs process for every delivery.
func New(process ProcessFunc, cfg *Config) (*Engine, error) {
	if process == nil {
		return nil, fmt.Errorf("%w: consume: nil ProcessFunc", idem.ErrInvalidConfig)
	}
	e := &Engine{process: process}
	if cfg != nil {
		e.cfg = *cfg
	}
	if err := idem.ValidateScope(e.cfg.Name); err != nil || e.cfg.Name == "" {
		return nil, fmt.Errorf("%w: consume: the consumer needs a name (1-%d bytes of UTF-8), got %q", idem.ErrInvalidConfig, idem.MaxScopeLen, e.cfg.Name)
	}
	if e.cfg.Retention < 0 {
		return nil, fmt.Errorf("%w: consume: retention must not be negative, got %v", idem.ErrInvalidConfig, e.cfg.Retention)
	}
	if e.cfg.Retention == 0 {
		e.cfg.Retention = idem.DefaultRetention
	}
	if e.cfg.MaxErrorBytes <= 0 {
		e.cfg.MaxErrorBytes = 1024
	}
	e.starts = idem.HooksOf[DeliveryStartHook](e.cfg.Hooks)
	e.ends = idem.HooksOf[DeliveryEndHook](e.cfg.Hooks)
	if e.cfg.Logger == nil {
		e.cfg.Logger = slog.Default()
	}
	if e.cfg.Now == nil {
		e.cfg.Now = time.Now
	}
	if e.cfg.Fingerprint == nil {
		e.cfg.Fingerprint = func(d Delivery) idem.Fingerprint { return idem.FingerprintBytes(d.Body()) }
	}
	e.policy = e.cfg.Retry.WithDefaults()
	return e, nil
}

// Config returns the engine's effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// Policy returns the effective retry policy, defaults filled in.
func (e *Engine) Policy() retry.Policy { return e.policy }

// Key returns the dedupe key for d under the engine's MissingID policy, or
// the dead-letter reason when it has none (idem.DeadMissingID,
// idem.DeadInvalidID).
func (e *Engine) Key(d Delivery) (key string, reason idem.DeadReason) {
	id := d.ID()
	if id == "" {
		if e.cfg.MissingID != ContentKey {
			return "", idem.DeadMissingID
		}
		sum := sha256.Sum256(d.Body())
		return hex.EncodeToString(sum[:]), ""
	}
	if idem.ValidateKey(id) != nil {
		return "", idem.DeadInvalidID
	}
	return id, ""
}

// Handle processes one delivery and settles it. The returned error reports
// a failure to settle (the broker will redeliver, and the redelivery is
// deduped); the Outcome says what the engine decided: idem.Processed,
// idem.Duplicate, idem.Retried, idem.DeadLettered, idem.Requeued or
// idem.Abandoned.
//
// The start hooks are called first and the delivery is handled with the
// context they return; the end hooks are called once, with the outcome,
// also when something panics (outcome idem.Panicked, before the panic goes
// on).
func (e *Engine) Handle(ctx context.Context, d Delivery) (idem.Outcome, error) {
	t := e.begin(ctx, d)
	defer e.endPanicked(t)
	return e.handleBegun(t)
}

// begun is a delivery whose start hooks have run.
type begun struct {
	d      Delivery
	st     State
	reason idem.DeadReason // when it has no usable key
	outer  context.Context // the caller's
	ctx    context.Context // from the start hooks
	ev     Event
	start  time.Time
	ended  bool
}

// begin derives d's key and calls the start hooks.
func (e *Engine) begin(ctx context.Context, d Delivery) *begun {
	st := d.State()
	key, reason := e.Key(d)
	t := &begun{d: d, st: st, reason: reason, outer: ctx, ctx: ctx,
		ev: Event{Consumer: e.cfg.Name, ID: d.ID(), Key: key, Attempt: st.Attempts + 1}}
	for _, h := range e.starts {
		t.ctx = h.OnDeliveryStart(t.ctx, t.ev)
	}
	t.start = time.Now()
	return t
}

// end completes t's event and calls the end hooks, once.
func (e *Engine) end(t *begun, out idem.Outcome, err error) {
	if t.ended {
		return
	}
	t.ended = true
	t.ev.Outcome, t.ev.Duration = out, time.Since(t.start)
	if err != nil && t.ev.Err == nil {
		t.ev.Err = err
	}
	for _, h := range e.ends {
		h.OnDeliveryEnd(t.ctx, t.ev)
	}
	if err != nil {
		e.cfg.Logger.Warn("idem: consumer could not settle a delivery; the broker will redeliver it",
			"consumer", e.cfg.Name, "id", t.ev.ID, "outcome", out, "err", err)
	}
}

// endPanicked, deferred, ends the deliveries a panic left unended.
func (e *Engine) endPanicked(ts ...*begun) {
	for _, t := range ts {
		if t != nil && !t.ended {
			e.end(t, idem.Panicked, nil)
		}
	}
}

// handleBegun handles and settles t, then ends it.
func (e *Engine) handleBegun(t *begun) (idem.Outcome, error) {
	out, err := e.handle(t.ctx, t.d, t.st, t.reason, &t.ev)
	e.end(t, out, err)
	if _, ok := t.d.(InProcess); ok {
		return e.again(t, out, err)
	}
	return out, err
}

func (e *Engine) handle(ctx context.Context, d Delivery, st State, reason idem.DeadReason, ev *Event) (idem.Outcome, error) {
	if reason != "" {
		ev.Reason = reason
		return e.deadLetter(ctx, d, st, reason, fmt.Errorf("consume: message id %q cannot be used as a dedupe key", textcut.Cut(d.ID(), 64)))
	}
	key := ev.Key
	msg := idem.Message{Scope: e.cfg.Name, Key: key, Fingerprint: e.cfg.Fingerprint(d), Retention: e.cfg.Retention}
	res, err := e.run(ctx, msg, d)
	ev.Err = err
	switch {
	case res == idem.Mismatch || errors.Is(err, idem.ErrFingerprintMismatch):
		ev.Reason = idem.DeadMismatch
		if err == nil {
			err = fmt.Errorf("%w (scope %q, key %q)", idem.ErrFingerprintMismatch, msg.Scope, msg.Key)
		}
		return e.deadLetter(ctx, d, st, idem.DeadMismatch, err)
	case err == nil && (res == idem.Processed || res == idem.Duplicate):
		return res, wrapSettle("ack", d.Ack(ctx))
	case err == nil:
		err = fmt.Errorf("consume: ProcessFunc returned %v without an error", res)
	}
	if ctx.Err() != nil {
		// Shutting down: the handler was interrupted, not wrong.
		return idem.Abandoned, nil
	}
	if errors.Is(err, idem.ErrCommitUnknown) {
		if serr := retry.Sleep(ctx, e.policy.Delay(st.Failures().Total())); serr != nil {
			return idem.Abandoned, nil
		}
		return idem.Requeued, wrapSettle("requeue", d.Requeue(ctx))
	}
	now := e.cfg.Now()
	next := st
	if next.FirstFailure.IsZero() {
		next.FirstFailure = now
	}
	next.LastFailure = now
	next.LastError = textcut.Cut(textcut.RootFirst(err), e.cfg.MaxErrorBytes)
	dec := e.policy.Decide(st.Failures(), err)
	if dec.Counted() {
		next.Attempts++
	} else {
		next.InfraRetries++
		ev.Infrastructure = true
	}
	if dec.GiveUp() {
		ev.Reason = dec.Reason
		return e.deadLetterState(ctx, d, next, dec.Reason)
	}
	ev.Delay = dec.Delay
	return idem.Retried, wrapSettle("retry", d.Retry(ctx, dec.Delay, next))
}

// run calls the ProcessFunc, turning a panic into a counted failure so that
// a poison message is retried and dead-lettered instead of killing the
// consumer.
func (e *Engine) run(ctx context.Context, msg idem.Message, d Delivery) (res idem.Outcome, err error) {
	defer func() {
		if p := recover(); p != nil {
			e.cfg.Logger.Error("idem: handler panicked", "consumer", e.cfg.Name, "key", msg.Key, "panic", p, "stack", string(debug.Stack()))
			res, err = "", fmt.Errorf("consume: handler panicked: %v", p)
		}
	}()
	return e.process(ctx, msg, d)
}

func (e *Engine) deadLetter(ctx context.Context, d Delivery, st State, reason idem.DeadReason, cause error) (idem.Outcome, error) {
	now := e.cfg.Now()
	if st.FirstFailure.IsZero() {
		st.FirstFailure = now
	}
	st.LastFailure = now
	st.LastError = textcut.Cut(textcut.RootFirst(cause), e.cfg.MaxErrorBytes)
	return e.deadLetterState(ctx, d, st, reason)
}

func (e *Engine) deadLetterState(ctx context.Context, d Delivery, st State, reason idem.DeadReason) (idem.Outcome, error) {
	dl := DeadLetter{State: st, Reason: reason, Consumer: e.cfg.Name, Origin: d.Origin(), OriginalID: d.ID()}
	err := wrapSettle("dead-letter", d.DeadLetter(ctx, dl))
	if err == nil {
		// Zero dead letters is the normal state: each one is worth a line.
		e.cfg.Logger.WarnContext(ctx, "idem: message dead-lettered", "consumer", e.cfg.Name, "id", textcut.Cut(d.ID(), 256),
			"reason", reason, "attempts", st.Attempts, "cause", st.LastError)
	}
	return idem.DeadLettered, err
}

func wrapSettle(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("consume: %s: %w", op, err)
}
