package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/runloop"
	"github.com/idem-go/idem/internal/textcut"
	"github.com/idem-go/idem/outbox/outboxdriver"
	"github.com/idem-go/idem/retry"
)

// Defaults of a [Config].
const (
	DefaultWorkers         = 2
	DefaultBatchSize       = 100
	DefaultLease           = 30 * time.Second
	DefaultPollInterval    = 200 * time.Millisecond
	DefaultRetention       = 24 * time.Hour
	DefaultPurgeInterval   = time.Minute
	DefaultPurgeBatch      = 1000
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultMaxAttempts is the relay's MaxAttempts when Config.Retry is
	// nil: an event is dead after 10 counted failures (a broker that is
	// down and says so with an idem.Retryable error counts none).
	DefaultMaxAttempts = 10
)

// Config configures a [Relay]. A nil *Config, and zero fields, mean the
// defaults.
type Config struct {
	// Workers is how many loops claim and publish concurrently, in this
	// process; any number of relay processes may share one outbox.
	// Default 2.
	Workers int
	// BatchSize is how many events one claim takes and one Publish call
	// gets (1..MaxBatch). Default 100.
	BatchSize int
	// Lease is how long a claim holds before another relay may take the
	// batch over (a crashed relay's batch is published again, with the
	// same ids, after it). Default 30s.
	Lease time.Duration
	// PublishTimeout bounds one Publish call; it must be below Lease, so
	// that a batch is normally finished before its lease ends. Default
	// Lease/2.
	PublishTimeout time.Duration
	// PollInterval is how long an idle loop waits before claiming again;
	// [Relay.Notify] wakes it earlier. Default 200ms.
	PollInterval time.Duration
	// Retry is the backoff schedule (full jitter by default) and
	// MaxAttempts, after which an event is dead. Nil means retry's
	// defaults with MaxAttempts DefaultMaxAttempts.
	Retry *retry.Policy
	// Ordered keeps at most one event per Key in flight, in write order.
	// A failing event holds back the later events of its Key until it is
	// sent; a dead one until it is redriven or discarded (publishing the
	// next event of the Key would break the order ordering was asked for).
	// Events with an empty Key are never held back.
	Ordered bool
	// Retention is how long sent events are kept before the purge deletes
	// them (for operators: the broker's and the consumers' dedupe do not
	// need them). Default 24h.
	Retention time.Duration
	// PurgeInterval is how often the relay purges sent events older than
	// Retention, PurgeBatch rows per transaction. Default 1m; negative
	// disables purging (call [Relay.Purge] yourself).
	PurgeInterval time.Duration
	// PurgeBatch is how many rows one purge statement deletes. Default 1000.
	PurgeBatch int
	// ShutdownTimeout bounds the graceful stop of [Relay.Run]. Default 30s.
	ShutdownTimeout time.Duration
	// Logger receives failures, dead events and lease losses. Default
	// slog.Default().
	Logger *slog.Logger
	// Hooks observe the publishing: each hook that implements
	// [PublishStartHook] is called, in order, before a batch is published,
	// and Publish runs with the context they return; each that implements
	// [PublishEndHook] is called once per event of the batch with its
	// outcome, also when the publisher panics. Hooks are called from the
	// relay's goroutines: they must be safe for concurrent use and fast.
	Hooks []idem.Hook
}

// Result reports what became of one event of a published batch to the
// hooks of Config.Hooks.
type Result struct {
	Message Message
	// Outcome is one of idem.Processed (the broker confirmed the event
	// and it is marked sent), idem.Retried (the publish failed; the event
	// is pending again), idem.DeadLettered (it went to the dead state),
	// idem.LeaseLost (another relay took the batch over; it publishes the
	// event again under the same id), idem.NotRecorded (the broker
	// confirmed it but marking it sent failed: it is published again, under
	// the same id, when its lease ends) and idem.Released (a hard stop cut
	// the publish short; the event is pending again).
	Outcome idem.Outcome
	// DeadReason says why the event is dead, when Outcome is
	// idem.DeadLettered: idem.DeadMaxAttempts or idem.DeadPermanent.
	DeadReason idem.DeadReason
	// Err is the publisher's (or the database's) error; nil when Processed.
	Err error
	// Duration is how long the batch took, claim to record.
	Duration time.Duration
}

// Relay publishes committed outbox events: its loops claim batches of due
// events, hand them to the Publisher and mark each sent once the broker
// confirmed it, retry the others with full jitter, and move poison events
// to the dead state. Several relays (processes or loops) share one outbox
// safely: claims skip each other's locked rows and every claim is fenced.
//
// Delivery is at least once: a relay that crashes between the broker's
// confirmation and the sent mark publishes the event again after its
// lease, with the same id, which the broker's dedupe (where it has one)
// and idem's consumers remove.
type Relay struct {
	d      outboxdriver.Driver
	pub    Publisher
	cfg    Config
	policy retry.Policy
	log    *slog.Logger
	starts []PublishStartHook
	ends   []PublishEndHook
	loops  *runloop.Group
}

// NewRelay returns a relay that publishes d's events with pub. It does not
// start.
func NewRelay(d Driver, pub Publisher, cfg *Config) (*Relay, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: outbox: nil driver", idem.ErrInvalidConfig)
	}
	if pub == nil {
		return nil, fmt.Errorf("%w: outbox: nil publisher", idem.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PurgeBatch == 0 {
		c.PurgeBatch = DefaultPurgeBatch
	}
	def(&c.Lease, DefaultLease)
	def(&c.PublishTimeout, c.Lease/2)
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.Retention, DefaultRetention)
	def(&c.PurgeInterval, DefaultPurgeInterval)
	def(&c.ShutdownTimeout, DefaultShutdownTimeout)
	switch {
	case c.Workers < 0:
		return nil, fmt.Errorf("%w: outbox: Workers must be positive, got %d", idem.ErrInvalidConfig, c.Workers)
	case c.BatchSize < 0 || c.BatchSize > MaxBatch:
		return nil, fmt.Errorf("%w: outbox: BatchSize must be 1..%d, got %d", idem.ErrInvalidConfig, MaxBatch, c.BatchSize)
	case c.Lease < 10*time.Millisecond:
		return nil, fmt.Errorf("%w: outbox: Lease must be at least 10ms, got %v", idem.ErrInvalidConfig, c.Lease)
	case c.PublishTimeout < 0 || c.PublishTimeout >= c.Lease:
		return nil, fmt.Errorf("%w: outbox: PublishTimeout (%v) must be positive and below Lease (%v)", idem.ErrInvalidConfig, c.PublishTimeout, c.Lease)
	case c.PollInterval < 0 || c.Retention < 0 || c.ShutdownTimeout < 0:
		return nil, fmt.Errorf("%w: outbox: durations must not be negative", idem.ErrInvalidConfig)
	case c.PurgeBatch < 0 || c.PurgeBatch > MaxBatch:
		return nil, fmt.Errorf("%w: outbox: PurgeBatch must be 1..%d, got %d", idem.ErrInvalidConfig, MaxBatch, c.PurgeBatch)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	pol := c.Retry
	if pol == nil {
		pol = &retry.Policy{MaxAttempts: DefaultMaxAttempts}
	}
	return &Relay{d: d, pub: pub, cfg: c, policy: pol.WithDefaults(), log: c.Logger,
		starts: idem.HooksOf[PublishStartHook](c.Hooks), ends: idem.HooksOf[PublishEndHook](c.Hooks),
		loops: runloop.New("outbox", "relay", c.Workers)}, nil
}

// Config returns the effective configuration.
func (r *Relay) Config() Config { return r.cfg }

// Notify wakes the idle loops so that events committed just now go out
// without waiting for the poll interval. Call it after committing a
// transaction that wrote events; it never blocks.
func (r *Relay) Notify() { r.loops.Wake(r.cfg.Workers) }

// Start launches the relay's loops and its purge loop. Cancelling ctx is
// a hard stop: publishes in flight are cancelled and their events given
// back. Use [Relay.Stop] for a graceful one. A Relay starts once.
func (r *Relay) Start(ctx context.Context) error {
	loops := make([]func(context.Context), r.cfg.Workers, r.cfg.Workers+1)
	for i := range loops {
		loops[i] = r.loop
	}
	if r.cfg.PurgeInterval > 0 {
		loops = append(loops, r.purgeLoop)
	}
	return r.loops.Start(ctx, loops...)
}

// Stop stops claiming, lets every loop finish the batch it is publishing
// (at most PublishTimeout) and waits. If ctx ends first, publishes are
// cancelled (their events given back) and Stop returns ctx's error once
// the loops have exited.
func (r *Relay) Stop(ctx context.Context) error { return r.loops.Stop(ctx) }

// Run starts the relay and blocks until ctx is done, then stops gracefully
// within Config.ShutdownTimeout.
func (r *Relay) Run(ctx context.Context) error {
	return r.loops.Run(ctx, r.Start, r.cfg.ShutdownTimeout)
}

// RunOnce claims one batch and publishes it in the calling goroutine. It
// returns how many events it claimed (0: nothing was due). Handy in tests
// and for a cron-style drain.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	rows, err := r.d.Claim(ctx, r.claimRequest())
	if err != nil {
		return 0, err
	}
	r.publish(ctx, rows)
	return len(rows), nil
}

// Purge deletes sent events older than Config.Retention, PurgeBatch rows
// per transaction, and returns how many it deleted.
func (r *Relay) Purge(ctx context.Context) (int64, error) {
	return r.d.PurgeSent(ctx, r.cfg.Retention, r.cfg.PurgeBatch)
}

func (r *Relay) claimRequest() outboxdriver.ClaimRequest {
	return outboxdriver.ClaimRequest{Limit: r.cfg.BatchSize, Lease: r.cfg.Lease, Ordered: r.cfg.Ordered}
}

func (r *Relay) loop(ctx context.Context) {
	req := r.claimRequest()
	runloop.Claims(ctx, r.loops, r.log, req.Limit, r.cfg.PollInterval,
		func(ctx context.Context) ([]Row, error) { return r.d.Claim(ctx, req) }, r.publish)
}

func (r *Relay) purgeLoop(ctx context.Context) {
	r.loops.Purges(ctx, r.log, r.cfg.PurgeInterval, "purged sent events", "events", r.Purge)
}

// message is the row as the publisher sees it.
func message(row Row) Message {
	return Message{ID: row.EventID, Topic: row.Topic, Key: row.Key, Payload: row.Payload, Headers: row.Headers,
		Attempt: row.Attempts + 1, CreatedAt: row.CreatedAt}
}

// callPublish runs the publisher and returns exactly one result per
// message: a panic or a result slice of the wrong length fails every
// message of the batch.
func (r *Relay) callPublish(ctx context.Context, msgs []Message) (errs []error) {
	defer func() {
		if p := recover(); p != nil {
			r.log.ErrorContext(ctx, "outbox: publisher panicked", "panic", p, "stack", string(debug.Stack()))
			err := fmt.Errorf("outbox: publisher panicked: %v", p)
			errs = make([]error, len(msgs))
			for i := range errs {
				errs[i] = err
			}
		}
	}()
	errs = r.pub.Publish(ctx, msgs)
	if errs != nil && len(errs) != len(msgs) {
		err := fmt.Errorf("outbox: publisher returned %d results for %d messages", len(errs), len(msgs))
		errs = make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
	}
	if errs == nil {
		errs = make([]error, len(msgs))
	}
	return errs
}

// publish publishes one claimed batch and records each event's outcome.
// ctx is cancelled only by a hard stop.
func (r *Relay) publish(ctx context.Context, rows []Row) {
	if len(rows) == 0 {
		return
	}
	start := time.Now()
	msgs := make([]Message, len(rows))
	for i, row := range rows {
		msgs[i] = message(row)
	}
	pctx := ctx
	for _, h := range r.starts {
		pctx = h.OnPublishStart(pctx, msgs)
	}
	results := make([]Result, len(rows))
	for i := range results {
		results[i] = Result{Message: msgs[i], Outcome: idem.Panicked}
	}
	defer func() { // also when a hook or the database driver panics
		d := time.Since(start)
		for i := range results {
			results[i].Duration = d
			for _, h := range r.ends {
				h.OnPublishEnd(pctx, results[i])
			}
		}
	}()

	tctx, cancel := context.WithTimeout(pctx, r.cfg.PublishTimeout)
	errs := r.callPublish(tctx, msgs)
	cancel()

	// Recording outlives a hard stop: a confirmed event not marked sent is
	// published again.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer rcancel()
	var (
		sent, released []outboxdriver.Lease
		fails          []outboxdriver.FailRequest
		byID           = make(map[int64]int, len(rows))
	)
	for i, row := range rows {
		byID[row.ID] = i
		err := errs[i]
		switch {
		case err == nil:
			sent = append(sent, row.Lease())
		case ctx.Err() != nil:
			released = append(released, row.Lease())
			results[i].Outcome, results[i].Err = idem.Released, err
		default:
			cause := err
			if Permanent(err) {
				cause = retry.Permanent(err)
			}
			d := r.policy.Decide(retry.Failures{Counted: row.Attempts}, cause)
			fails = append(fails, outboxdriver.FailRequest{Lease: row.Lease(), Error: outboxdriver.CutError(textcut.RootFirst(err)),
				Delay: d.Delay, Uncounted: !d.Counted(), Dead: d.GiveUp(), DeadReason: d.Reason})
			results[i].Err = err
		}
	}
	// every outcome is set below; a result left Panicked means a panic
	// went through here.
	if len(sent) > 0 {
		marked, err := r.d.MarkSent(rctx, sent)
		r.settle(ctx, sent, marked, err, results, byID, idem.Processed, "marking events sent")
	}
	if len(fails) > 0 {
		ls := make([]outboxdriver.Lease, len(fails))
		for i, f := range fails {
			ls[i] = f.Lease
		}
		recorded, err := r.d.Fail(rctx, fails)
		r.settle(ctx, ls, recorded, err, results, byID, idem.Retried, "recording failed publishes")
		for _, f := range fails {
			res := &results[byID[f.ID]]
			if res.Outcome == idem.Retried && f.Dead {
				res.Outcome, res.DeadReason = idem.DeadLettered, f.DeadReason
				r.log.WarnContext(ctx, "outbox: event is dead", "row", f.ID, "id", res.Message.ID, "topic", res.Message.Topic,
					"reason", f.DeadReason, "attempts", res.Message.Attempt, "err", res.Err)
			} else if res.Outcome == idem.Retried {
				r.log.InfoContext(ctx, "outbox: publish failed; retrying", "row", f.ID, "id", res.Message.ID,
					"attempt", res.Message.Attempt, "delay", f.Delay, "err", res.Err)
			}
		}
	}
	if len(released) > 0 {
		if _, err := r.d.Release(rctx, released); err != nil {
			r.log.WarnContext(ctx, "outbox: release on stop failed; the events come back when their leases expire", "events", len(released), "err", err)
		}
	}
}

// settle sets the outcome of the events of ls: ok for those in done,
// LeaseLost for the others; when the statement failed, NotRecorded (for a
// confirmed event) or the failure joined to the publish error.
func (r *Relay) settle(ctx context.Context, ls []outboxdriver.Lease, done []int64, err error, results []Result, byID map[int64]int, ok idem.Outcome, what string) {
	if err != nil {
		r.log.WarnContext(ctx, "outbox: "+what+" failed; the events are published again when their leases expire", "events", len(ls), "err", err)
		for _, l := range ls {
			res := &results[byID[l.ID]]
			if ok == idem.Processed {
				res.Outcome, res.Err = idem.NotRecorded, err
			} else {
				res.Outcome, res.Err = idem.NotRecorded, errors.Join(res.Err, err)
			}
		}
		return
	}
	kept := make(map[int64]bool, len(done))
	for _, id := range done {
		kept[id] = true
	}
	for _, l := range ls {
		res := &results[byID[l.ID]]
		if kept[l.ID] {
			res.Outcome = ok
			continue
		}
		res.Outcome = idem.LeaseLost
		res.Err = errors.Join(res.Err, fmt.Errorf("outbox: row %d (token %d): %w", l.ID, l.Token, idem.ErrLeaseLost))
		r.log.WarnContext(ctx, "outbox: lease lost; another relay has the event", "row", l.ID, "id", res.Message.ID)
	}
}
