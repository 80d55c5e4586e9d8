package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/internal/keeper"
	"github.com/idem-go/idem/internal/runloop"
	"github.com/idem-go/idem/internal/textcut"
	"github.com/idem-go/idem/retry"
)

// Handler applies one message's effect in tx, the transaction that also
// marks the message processed. Return nil to commit; an error rolls the
// effect back and schedules a retry (retry.Permanent: dead at once;
// retry.After: not before the given delay; idem.Retryable: an
// infrastructure failure that does not count as an attempt). A panic is a
// failure like an error.
type Handler[Tx any] func(ctx context.Context, tx Tx, msg Message) error

// Defaults of a [Config].
const (
	DefaultWorkers         = 4
	DefaultBatchSize       = 10
	DefaultLease           = 30 * time.Second
	DefaultPollInterval    = 500 * time.Millisecond
	DefaultPurgeInterval   = time.Minute
	DefaultPurgeBatch      = 1000
	DefaultShutdownTimeout = 30 * time.Second
)

// Config configures a [Worker]. A nil *Config, and zero fields, mean the
// defaults.
type Config struct {
	// Workers is how many loops claim and process concurrently. Default 4.
	Workers int
	// BatchSize is how many rows one claim takes (1..MaxBatch). Default 10.
	// Larger batches amortise the claim; every row of a batch is leased
	// until the loop reaches it, so keep BatchSize × handler time well
	// below Lease (the heartbeat extends the leases meanwhile anyway).
	BatchSize int
	// Lease is how long a claim holds before another worker may take the
	// row over; heartbeats extend it every Lease/3. Default 30s.
	Lease time.Duration
	// PollInterval is how long an idle loop waits before claiming again.
	// Default 500ms.
	PollInterval time.Duration
	// Retry is the backoff schedule (full jitter by default) and
	// MaxAttempts, after which a row is dead. Nil means retry's defaults.
	Retry *retry.Policy
	// Ordered processes messages that share an ordering key one at a time,
	// in receive order; a failing message holds back only its own key
	// (until it is processed or dead).
	Ordered bool
	// Retention is how long processed rows are kept: receiving the same
	// (source, id) within it is a duplicate. Default idem.DefaultRetention.
	Retention time.Duration
	// PurgeInterval is how often the worker deletes processed rows older
	// than Retention. Default 1m; negative disables purging.
	PurgeInterval time.Duration
	// PurgeBatch is how many rows one purge statement deletes. Default 1000.
	PurgeBatch int
	// ShutdownTimeout bounds the graceful stop of [Worker.Run]. Default 30s.
	ShutdownTimeout time.Duration
	// Logger receives failures and lease losses. Default slog.Default().
	Logger *slog.Logger
	// Hooks observe the runs: each hook that implements [RunStartHook] is
	// called, in order, before a claimed row's handler runs, and the handler
	// runs with the context they return (so a span a hook starts is the
	// parent of the handler's own spans); each that implements
	// [RunEndHook] is called once per run with its outcome, also when the
	// run panics. Rows that did not run (released on stop, or their lease
	// lost first) are reported too, start then end. Hooks are called from
	// the worker's goroutines: they must be safe for concurrent use and
	// fast.
	Hooks []idem.Hook
}

// Event reports one run to the hooks of Config.Hooks. A start hook gets
// Message only.
type Event struct {
	Message Message
	// Outcome is one of idem.Processed (the handler's effect and the
	// processed mark committed), idem.Retried (the run failed; the row is
	// pending again), idem.DeadLettered (the row went to the dead letters),
	// idem.LeaseLost (another worker took the row over; nothing was
	// committed), idem.Released (the worker stopped and gave the row back
	// unprocessed), idem.Abandoned (a hard stop cancelled the handler and
	// the row could not be given back: it is due again when its lease
	// expires) and idem.Panicked (the worker itself panicked during the
	// run; a handler's panic is a failure like an error).
	Outcome idem.Outcome
	// DeadReason says why the row went to the dead letters, when Outcome is
	// idem.DeadLettered: idem.DeadMaxAttempts, idem.DeadPermanent or
	// idem.DeadNoHandler.
	DeadReason idem.DeadReason
	// Err is the handler's (or the backend's) error; nil when Processed.
	Err error
	// Duration is how long the run took.
	Duration time.Duration
}

// Worker claims due inbox rows and dispatches them by event type to the
// registered handlers. Register handlers with [Worker.Handle], then
// [Worker.Start] and [Worker.Stop] (or [Worker.Run]).
type Worker[Tx any] struct {
	b      inboxdriver.Backend[Tx]
	cfg    Config
	policy retry.Policy
	log    *slog.Logger
	starts []RunStartHook
	ends   []RunEndHook

	loops *runloop.Group

	mu       sync.Mutex // guards handlers
	handlers map[string]Handler[Tx]
}

// NewWorker returns a worker over b. It does not start.
func NewWorker[Tx any](b inboxdriver.Backend[Tx], cfg *Config) (*Worker[Tx], error) {
	if b == nil {
		return nil, fmt.Errorf("%w: inbox: nil backend", idem.ErrInvalidConfig)
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
	def(&c.PollInterval, DefaultPollInterval)
	def(&c.Retention, idem.DefaultRetention)
	def(&c.PurgeInterval, DefaultPurgeInterval)
	def(&c.ShutdownTimeout, DefaultShutdownTimeout)
	switch {
	case c.Workers < 0:
		return nil, fmt.Errorf("%w: inbox: Workers must be positive, got %d", idem.ErrInvalidConfig, c.Workers)
	case c.BatchSize < 0 || c.BatchSize > MaxBatch:
		return nil, fmt.Errorf("%w: inbox: BatchSize must be 1..%d, got %d", idem.ErrInvalidConfig, MaxBatch, c.BatchSize)
	case c.Lease < 3*time.Millisecond:
		return nil, fmt.Errorf("%w: inbox: Lease must be at least 3ms, got %v", idem.ErrInvalidConfig, c.Lease)
	case c.PollInterval < 0 || c.Retention < 0 || c.ShutdownTimeout < 0:
		return nil, fmt.Errorf("%w: inbox: durations must not be negative", idem.ErrInvalidConfig)
	case c.PurgeBatch < 0:
		return nil, fmt.Errorf("%w: inbox: PurgeBatch must be positive, got %d", idem.ErrInvalidConfig, c.PurgeBatch)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &Worker[Tx]{b: b, cfg: c, policy: c.Retry.WithDefaults(), log: c.Logger,
		starts: idem.HooksOf[RunStartHook](c.Hooks), ends: idem.HooksOf[RunEndHook](c.Hooks),
		loops: runloop.New("inbox", "worker", 0), handlers: map[string]Handler[Tx]{}}, nil
}

// Config returns the effective configuration.
func (w *Worker[Tx]) Config() Config { return w.cfg }

// Handle registers h for eventType. It fails after Start and for a type
// that already has a handler.
func (w *Worker[Tx]) Handle(eventType string, h Handler[Tx]) error {
	return w.loops.Locked(func(started bool) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		switch {
		case started:
			return fmt.Errorf("%w: inbox: register handlers before Start", idem.ErrInvalidConfig)
		case h == nil:
			return fmt.Errorf("%w: inbox: nil handler for %q", idem.ErrInvalidConfig, eventType)
		case w.handlers[eventType] != nil:
			return fmt.Errorf("%w: inbox: event type %q already has a handler", idem.ErrInvalidConfig, eventType)
		}
		w.handlers[eventType] = h
		return nil
	})
}

// Start launches the worker loops and the purge loop. Cancelling ctx is a
// hard stop: running handlers see a cancelled context and their rows are
// released. Use [Worker.Stop] for a graceful one. A Worker starts once;
// after Stop, create a new one.
func (w *Worker[Tx]) Start(ctx context.Context) error {
	loops := make([]func(context.Context), w.cfg.Workers, w.cfg.Workers+1)
	for i := range loops {
		loops[i] = w.loop
	}
	if w.cfg.PurgeInterval > 0 {
		loops = append(loops, w.purgeLoop)
	}
	return w.loops.Start(ctx, loops...)
}

// Stop stops claiming, lets every loop finish the row it is running,
// releases the rows it claimed but did not start, and waits. If ctx ends
// first, running handlers are cancelled (their rows released) and Stop
// returns ctx's error once the loops have exited.
func (w *Worker[Tx]) Stop(ctx context.Context) error { return w.loops.Stop(ctx) }

// Run starts the worker and blocks until ctx is done, then stops
// gracefully within Config.ShutdownTimeout.
func (w *Worker[Tx]) Run(ctx context.Context) error {
	return w.loops.Run(ctx, w.Start, w.cfg.ShutdownTimeout)
}

// RunOnce claims one batch and processes it in the calling goroutine. It
// returns how many rows it claimed (0: nothing was due). Handy in tests and
// for a cron-style drain.
func (w *Worker[Tx]) RunOnce(ctx context.Context) (int, error) {
	rows, err := w.b.Claim(ctx, inboxdriver.ClaimRequest{Limit: w.cfg.BatchSize, Lease: w.cfg.Lease, Ordered: w.cfg.Ordered})
	if err != nil {
		return 0, err
	}
	w.runBatch(ctx, rows)
	return len(rows), nil
}

func (w *Worker[Tx]) loop(ctx context.Context) {
	req := inboxdriver.ClaimRequest{Limit: w.cfg.BatchSize, Lease: w.cfg.Lease, Ordered: w.cfg.Ordered}
	runloop.Claims(ctx, w.loops, w.log, req.Limit, w.cfg.PollInterval,
		func(ctx context.Context) ([]Row, error) { return w.b.Claim(ctx, req) }, w.runBatch)
}

func (w *Worker[Tx]) purgeLoop(ctx context.Context) {
	w.loops.Purges(ctx, w.log, w.cfg.PurgeInterval, "purged processed rows", "rows",
		func(ctx context.Context) (int64, error) {
			return w.b.PurgeProcessed(ctx, w.cfg.Retention, w.cfg.PurgeBatch)
		})
}

// batchLeases tracks the leases of one batch for its heartbeat.
type batchLeases struct {
	mu     sync.Mutex
	held   map[int64]int64 // id -> token
	cancel map[int64]context.CancelCauseFunc
}

func (bl *batchLeases) list() []inboxdriver.Lease {
	bl.mu.Lock()
	defer bl.mu.Unlock()
	out := make([]inboxdriver.Lease, 0, len(bl.held))
	for id, tok := range bl.held {
		out = append(out, inboxdriver.Lease{ID: id, Token: tok})
	}
	return out
}

func (bl *batchLeases) drop(id int64) {
	bl.mu.Lock()
	delete(bl.held, id)
	delete(bl.cancel, id)
	bl.mu.Unlock()
}

// runBatch processes rows in order while a heartbeat extends the leases of
// the rows not finished yet. On stop it releases the rows it did not start.
func (w *Worker[Tx]) runBatch(ctx context.Context, rows []Row) {
	if len(rows) == 0 {
		return
	}
	bl := &batchLeases{held: make(map[int64]int64, len(rows)), cancel: map[int64]context.CancelCauseFunc{}}
	for _, r := range rows {
		bl.held[r.ID] = r.Token
	}
	// The batch as a whole is never lost (ErrLost is a sentinel no Extend
	// returns) and a failing database is retried until the rows' leases
	// expire (GiveUp < 0): extend cancels the run of each row found lost.
	k := keeper.Start(ctx, keeper.Config{Lease: w.cfg.Lease, GiveUp: -1, ErrLost: errBatchNeverLost,
		Extend: func(ctx context.Context) error { return w.extend(ctx, bl) }, Logger: w.log, LogPrefix: "inbox"})
	defer k.Stop()
	for i, r := range rows {
		if w.loops.Stopping() || ctx.Err() != nil {
			w.release(ctx, bl, rows[i:], nil)
			return
		}
		bl.mu.Lock()
		_, held := bl.held[r.ID]
		rctx, cancel := context.WithCancelCause(ctx)
		bl.cancel[r.ID] = cancel
		bl.mu.Unlock()
		if held {
			w.runOne(rctx, ctx, r)
		} else {
			w.report(ctx, Event{Message: r.Message(), Outcome: idem.LeaseLost, Err: idem.ErrLeaseLost})
		}
		cancel(nil)
		bl.drop(r.ID)
	}
}

// errBatchNeverLost is the keeper's ErrLost for a batch: no Extend returns
// it, so a batch's keeper only ends when the batch is done.
var errBatchNeverLost = errors.New("inbox: batch lease lost")

// extend is one heartbeat of a batch: it extends the leases of the rows not
// finished yet and cancels the run of each row whose lease was lost.
func (w *Worker[Tx]) extend(ctx context.Context, bl *batchLeases) error {
	ls := bl.list()
	if len(ls) == 0 {
		return nil
	}
	kept, err := w.b.Extend(ctx, ls, w.cfg.Lease)
	if err != nil {
		// The rows stay leased until their expiry; if the database stays
		// unreachable, completes fail and the rows come back later.
		return fmt.Errorf("extend %d leases: %w", len(ls), err)
	}
	keep := make(map[int64]bool, len(kept))
	for _, id := range kept {
		keep[id] = true
	}
	bl.mu.Lock()
	defer bl.mu.Unlock()
	for _, l := range ls {
		if keep[l.ID] {
			continue
		}
		if c := bl.cancel[l.ID]; c != nil {
			c(fmt.Errorf("inbox: row %d: %w", l.ID, idem.ErrLeaseLost))
		}
		delete(bl.held, l.ID)
	}
	return nil
}

// release gives back the rows of a batch and reports them released; with
// run set, rows[0] is the row of that run, ended instead of reported. It
// returns false when the rows could not be given back.
func (w *Worker[Tx]) release(ctx context.Context, bl *batchLeases, rows []Row, run *Event) bool {
	ls := make([]inboxdriver.Lease, 0, len(rows))
	bl.mu.Lock()
	for _, r := range rows {
		if tok, ok := bl.held[r.ID]; ok {
			ls = append(ls, inboxdriver.Lease{ID: r.ID, Token: tok})
		}
	}
	bl.mu.Unlock()
	if len(ls) == 0 {
		return false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if _, err := w.b.Release(rctx, ls); err != nil {
		w.log.WarnContext(ctx, "inbox: release on stop failed; the rows come back when their leases expire", "rows", len(ls), "err", err)
		return false
	}
	for i, r := range rows {
		if i == 0 && run != nil {
			run.Outcome = idem.Released
			continue
		}
		w.report(ctx, Event{Message: r.Message(), Outcome: idem.Released})
	}
	return true
}

// begin calls the start hooks in order and returns the context the run
// goes on with.
func (w *Worker[Tx]) begin(ctx context.Context, msg Message) context.Context {
	for _, h := range w.starts {
		ctx = h.OnRunStart(ctx, Event{Message: msg})
	}
	return ctx
}

// end calls the end hooks with the run's context and event.
func (w *Worker[Tx]) end(ctx context.Context, ev Event) {
	for _, h := range w.ends {
		h.OnRunEnd(ctx, ev)
	}
}

// report reports a row that did not run: start hooks, then end hooks.
func (w *Worker[Tx]) report(ctx context.Context, ev Event) {
	if len(w.starts) > 0 || len(w.ends) > 0 {
		w.end(w.begin(ctx, ev.Message), ev)
	}
}

// runOne runs the row's handler in the backend's completing transaction,
// records the outcome and reports the run to the hooks. rctx is cancelled
// when the lease is lost; ctx only on a hard stop.
func (w *Worker[Tx]) runOne(rctx, ctx context.Context, r Row) {
	ev := Event{Message: r.Message()}
	rctx = w.begin(rctx, ev.Message)
	start := time.Now()
	finished := false
	defer func() {
		if !finished { // the panic goes on once the hooks have the run
			ev.Outcome, ev.DeadReason = idem.Panicked, ""
		}
		ev.Duration = time.Since(start)
		w.end(rctx, ev)
	}()
	w.run(rctx, ctx, r, &ev)
	finished = true
}

// run is runOne; it records the outcome in ev.
func (w *Worker[Tx]) run(rctx, ctx context.Context, r Row, ev *Event) {
	msg := ev.Message
	lease := inboxdriver.Lease{ID: r.ID, Token: r.Token}
	w.mu.Lock()
	h := w.handlers[r.Type]
	w.mu.Unlock()
	if h == nil {
		text := fmt.Sprintf("no handler registered for event type %q", r.Type)
		w.fail(rctx, r, inboxdriver.FailRequest{Lease: lease, Error: text, Dead: true, DeadReason: idem.DeadNoHandler}, errors.New("inbox: "+text), ev)
		return
	}
	err := w.b.Complete(rctx, lease, func(ctx context.Context, tx Tx) (err error) {
		defer func() {
			if p := recover(); p != nil {
				w.log.ErrorContext(ctx, "inbox: handler panicked", "row", r.ID, "type", r.Type, "panic", p, "stack", string(debug.Stack()))
				err = fmt.Errorf("inbox: handler for %q panicked: %v", r.Type, p)
			}
		}()
		return h(ctx, tx, msg)
	})
	switch {
	case err == nil:
		ev.Outcome = idem.Processed
		return
	case errors.Is(err, idem.ErrLeaseLost) || errors.Is(context.Cause(rctx), idem.ErrLeaseLost):
		w.log.WarnContext(rctx, "inbox: lease lost; another worker has the row", "row", r.ID, "err", err)
		ev.Outcome, ev.Err = idem.LeaseLost, err
		return
	case ctx.Err() != nil:
		// A hard stop cancelled the handler: not the message's fault.
		ev.Outcome = idem.Abandoned
		w.release(rctx, &batchLeases{held: map[int64]int64{r.ID: r.Token}}, []Row{r}, ev)
		return
	}
	// Infrastructure failures are not counted in the row, so the backoff of
	// an outage grows with the counted attempts only.
	d := w.policy.Decide(retry.Failures{Counted: r.Attempts}, err)
	req := inboxdriver.FailRequest{Lease: lease, Error: inboxdriver.CutError(textcut.RootFirst(err)), Delay: d.Delay, Uncounted: !d.Counted(),
		Dead: d.GiveUp(), DeadReason: d.Reason}
	w.fail(rctx, r, req, err, ev)
}

// fail records a failed run and its outcome in ev.
func (w *Worker[Tx]) fail(ctx context.Context, r Row, req inboxdriver.FailRequest, cause error, ev *Event) {
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	ev.Outcome, ev.Err = idem.Retried, cause
	if err := w.b.Fail(fctx, req); err != nil {
		if errors.Is(err, idem.ErrLeaseLost) {
			ev.Outcome = idem.LeaseLost
		} else {
			// The row stays leased; it is run again after the lease expires.
			w.log.WarnContext(ctx, "inbox: recording a failure failed", "row", r.ID, "err", err, "cause", cause)
			ev.Err = errors.Join(cause, err)
		}
	} else if req.Dead {
		ev.Outcome, ev.DeadReason = idem.DeadLettered, req.DeadReason
		w.log.WarnContext(ctx, "inbox: message is dead", "row", r.ID, "source", r.Source, "id", r.MessageID,
			"type", r.Type, "reason", req.DeadReason, "attempts", r.Attempts+1, "err", cause)
	}
}
