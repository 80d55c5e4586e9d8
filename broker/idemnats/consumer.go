package idemnats

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/shared/bounded"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers the consumer adds to a dead letter besides the consume.Header*
// failure metadata.
const (
	// HeaderStream and HeaderStreamSeq locate the original message.
	HeaderStream    = "x-idem-stream"
	HeaderStreamSeq = "x-idem-stream-seq"
	// HeaderDeliveries is the server's delivery count of the original.
	HeaderDeliveries = "x-idem-deliveries"
)

// Config configures a [Consumer]. The embedded consume.Config is the
// engine's: Name (required: the dedupe scope and the consumer named in dead
// letters; several JetStream consumers may share one Name and then
// deduplicate against each other), Retry (nil: full jitter, base 1s, cap
// 1m, 5 attempts, applied with NakWithDelay), Retention (default 24h; it
// must cover the redelivery horizon, see [NewConsumer]), MissingID (for
// messages without a Nats-Msg-Id), Fingerprint, MaxErrorBytes, Hooks,
// Logger and Now, with the meanings and defaults documented there.
type Config struct {
	consume.Config
	// Stream and Consumer name an existing durable JetStream consumer with
	// AckPolicy explicit. Required.
	Stream, Consumer string
	// Process runs the handler idempotently for each delivery. Required.
	Process consume.ProcessFunc
	// DeadLetterSubject is where messages go after MaxAttempts, a
	// permanent error, an id conflict or a missing id. A stream must
	// capture it (checked at start). Required.
	DeadLetterSubject string
	// DoubleAck waits for the server to confirm every ack, so that a lost
	// ack is noticed (the redelivery is deduped either way).
	DoubleAck bool
	// Heartbeat is how often a running handler tells the server it is
	// still working (InProgress) so that AckWait does not expire under it.
	// Default AckWait/3; negative disables it.
	Heartbeat time.Duration
	// Concurrency is the number of handler goroutines. Default 4.
	Concurrency int
}

// Consumer consumes one durable JetStream consumer through the shared
// consume.Engine.
type Consumer struct {
	js     jetstream.JetStream
	cfg    Config
	engine *consume.Engine
	states *bounded.Map[uint64, retryState]
}

// maxStates bounds the in-process retry-state cache.
const maxStates = 10000

// NewConsumer checks cfg and returns a Consumer; it does no I/O.
// [Consumer.Ping], and [Consumer.Run] before it starts, look up the
// durable consumer, its stream and the dead-letter stream and check them.
//
// Both refuse (an error wrapping idem.ErrInvalidConfig that names both
// numbers) a dedupe retention shorter than the redelivery horizon: the
// longest of max_attempts × max_backoff (checked here), the consumer's
// AckWait × MaxDeliver (AckWait × max_attempts when MaxDeliver is
// unlimited) and the stream's duplicate window (checked by Ping and Run).
// Ping and Run also refuse a consumer whose MaxDeliver would stop
// redeliveries before idem dead-letters, one without explicit acks, a
// dead-letter subject no stream captures, and a dead-letter stream whose
// duplicate window is shorter than the consumer's AckWait (a dead letter
// published again after a crash would be stored twice).
func NewConsumer(js jetstream.JetStream, cfg *Config) (*Consumer, error) {
	if js == nil || cfg == nil {
		return nil, fmt.Errorf("%w: idemnats: NewConsumer needs a JetStream context and a config", idem.ErrInvalidConfig)
	}
	c := &Consumer{js: js, cfg: *cfg, states: bounded.New[uint64, retryState](maxStates)}
	if c.cfg.Stream == "" || c.cfg.Consumer == "" {
		return nil, fmt.Errorf("%w: idemnats: Stream and Consumer are required", idem.ErrInvalidConfig)
	}
	if c.cfg.DeadLetterSubject == "" {
		return nil, fmt.Errorf("%w: idemnats: DeadLetterSubject is required", idem.ErrInvalidConfig)
	}
	if c.cfg.Concurrency <= 0 {
		c.cfg.Concurrency = 4
	}
	engine, err := consume.New(c.cfg.Process, &c.cfg.Config)
	if err != nil {
		return nil, err
	}
	c.cfg.Config = engine.Config() // the engine's defaults filled in
	c.engine = engine
	p := engine.Policy()
	if err := consume.CheckRetention(c.cfg.Retention, p.MaxAttempts, p.Cap); err != nil {
		return nil, err
	}
	return c, nil
}

// Ping looks up the durable consumer, its stream and the stream that
// captures the dead-letter subject, and checks them against the
// configuration (see [NewConsumer]), as Run does before it starts. The
// error names what is missing or wrong.
func (c *Consumer) Ping(ctx context.Context) error {
	_, err := c.lookup(ctx)
	return err
}

// lookup finds and checks the durable consumer (see [Consumer.Ping]).
func (c *Consumer) lookup(ctx context.Context) (jetstream.Consumer, error) {
	stream, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("idemnats: stream %q: %w", c.cfg.Stream, err)
	}
	cons, err := stream.Consumer(ctx, c.cfg.Consumer)
	if err != nil {
		return nil, fmt.Errorf("idemnats: consumer %q on stream %q: %w", c.cfg.Consumer, c.cfg.Stream, err)
	}
	cc := cons.CachedInfo().Config
	if err := c.check(cc, stream.CachedInfo().Config); err != nil {
		return nil, err
	}
	name, err := c.js.StreamNameBySubject(ctx, c.cfg.DeadLetterSubject)
	if err != nil {
		return nil, fmt.Errorf("%w: idemnats: no stream captures the dead-letter subject %q: %w", idem.ErrInvalidConfig, c.cfg.DeadLetterSubject, err)
	}
	dlq, err := c.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("idemnats: dead-letter stream %q: %w", name, err)
	}
	// A dead letter published again after a crash (before the original
	// was terminated) comes once the original is redelivered, after
	// AckWait: the dead-letter stream drops the copy only inside its
	// duplicate window.
	if dup := dlq.CachedInfo().Config.Duplicates; dup < cc.AckWait {
		return nil, fmt.Errorf("%w: idemnats: dead-letter stream %q has a duplicate window of %v, shorter than consumer %q's AckWait %v: a dead letter published again after a crash would be stored twice; raise the window above %v",
			idem.ErrInvalidConfig, name, dup, c.cfg.Consumer, cc.AckWait, cc.AckWait)
	}
	return cons, nil
}

// check applies the start-up rules of [NewConsumer] to the server's
// configuration.
func (c *Consumer) check(cc jetstream.ConsumerConfig, sc jetstream.StreamConfig) error {
	p := c.engine.Policy()
	if cc.AckPolicy != jetstream.AckExplicitPolicy {
		return fmt.Errorf("%w: idemnats: consumer %q has ack policy %v; idem needs explicit acks to ack after the commit", idem.ErrInvalidConfig, c.cfg.Consumer, cc.AckPolicy)
	}
	if cc.MaxDeliver > 0 && p.MaxAttempts > 0 && cc.MaxDeliver < p.MaxAttempts {
		return fmt.Errorf("%w: idemnats: consumer %q has MaxDeliver %d, below max_attempts %d: the server would drop the message before idem dead-letters it", idem.ErrInvalidConfig, c.cfg.Consumer, cc.MaxDeliver, p.MaxAttempts)
	}
	redeliver := consume.Window{Name: fmt.Sprintf("JetStream AckWait %v × MaxDeliver %d", cc.AckWait, cc.MaxDeliver)}
	switch {
	case cc.MaxDeliver > 0:
		redeliver.D = consume.Horizon(cc.MaxDeliver, cc.AckWait).D
	case p.MaxAttempts > 0:
		// Unlimited redeliveries end when idem dead-letters the message.
		redeliver.Name = fmt.Sprintf("JetStream AckWait %v × max_attempts %d (MaxDeliver unlimited)", cc.AckWait, p.MaxAttempts)
		redeliver.D = consume.Horizon(p.MaxAttempts, cc.AckWait).D
	}
	dup := consume.Window{Name: fmt.Sprintf("stream %q duplicate window", sc.Name), D: sc.Duplicates}
	return consume.CheckRetention(c.cfg.Retention, p.MaxAttempts, p.Cap, redeliver, dup)
}

// Engine returns the consumer's engine.
func (c *Consumer) Engine() *consume.Engine { return c.engine }

// Run checks the server's configuration as [Consumer.Ping] does, then
// consumes until ctx ends and returns nil then, or the error of the check
// or the one that stopped the message iterator. In-flight handlers see ctx
// end; whatever they did not ack is redelivered by the server after
// AckWait and deduped. A Consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	cons, err := c.lookup(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if c.cfg.Heartbeat == 0 {
		c.cfg.Heartbeat = cons.CachedInfo().Config.AckWait / 3
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * c.cfg.Concurrency))
	if err != nil {
		return fmt.Errorf("idemnats: consume %q/%q: %w", c.cfg.Stream, c.cfg.Consumer, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	msgs := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range c.cfg.Concurrency {
		wg.Go(func() {
			for m := range msgs {
				c.handle(ctx, m)
			}
		})
	}
	var runErr error
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				runErr = fmt.Errorf("idemnats: consume %q/%q: %w", c.cfg.Stream, c.cfg.Consumer, err)
			}
			break
		}
		msgs <- m
	}
	it.Stop()
	close(msgs)
	wg.Wait()
	return runErr
}

// handle runs the engine on m, heartbeating while it works.
func (c *Consumer) handle(ctx context.Context, m jetstream.Msg) {
	d := &delivery{c: c, m: m}
	if md, err := m.Metadata(); err == nil {
		d.md = md
	}
	done := make(chan struct{})
	var hb sync.WaitGroup
	if c.cfg.Heartbeat > 0 {
		hb.Go(func() {
			t := time.NewTicker(c.cfg.Heartbeat)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
					if err := m.InProgress(); err != nil {
						c.cfg.Logger.Warn("idem: nats in-progress heartbeat failed", "consumer", c.cfg.Name, "err", err)
					}
				}
			}
		})
	}
	_, _ = c.engine.Handle(ctx, d)
	close(done)
	hb.Wait()
}

// delivery adapts a jetstream.Msg to consume.Delivery.
type delivery struct {
	c  *Consumer
	m  jetstream.Msg
	md *jetstream.MsgMetadata
}

// ID is the producer's Nats-Msg-Id, never the stream sequence: a
// producer's retry gets a new sequence but keeps its id.
func (d *delivery) ID() string     { return d.m.Headers().Get(jetstream.MsgIDHeader) }
func (d *delivery) Body() []byte   { return d.m.Data() }
func (d *delivery) Origin() string { return d.m.Subject() }

func (d *delivery) seq() uint64 {
	if d.md == nil {
		return 0
	}
	return d.md.Sequence.Stream
}

// State is the message's retry state, derived from the server's delivery
// count, which every process sees, and the state this process recorded at
// its own last failure of the message (NAK cannot rewrite headers):
//
//   - every delivery this process did not handle itself (another process
//     had it, or this one before a restart) counts as one failed attempt,
//     so a message is never dead-lettered later than max_attempts, and
//     never earlier when the failures were counted ones;
//   - the failure times and last error are this process's, exact when it
//     saw the first failure; otherwise the first failure is the message's
//     stream timestamp (when it was stored: the earliest the first failure
//     can have been).
func (d *delivery) State() consume.State {
	before := d.before()
	if e, ok := d.c.states.Get(d.seq()); ok && e.delivered <= before {
		st := e.st
		st.Attempts += before - e.delivered
		return st
	}
	st := consume.ParseState(func(name string) (string, bool) {
		v := d.m.Headers().Values(name)
		if len(v) == 0 {
			return "", false
		}
		return v[0], true
	})
	if before > 0 {
		st.Attempts = max(st.Attempts, before)
		if st.FirstFailure.IsZero() {
			st.FirstFailure = d.md.Timestamp
		}
	}
	return st
}

// before is the number of earlier deliveries of the message, from the
// server's count.
func (d *delivery) before() int {
	if d.md == nil || d.md.NumDelivered < 1 {
		return 0
	}
	return int(d.md.NumDelivered - 1)
}

func (d *delivery) Ack(ctx context.Context) error {
	d.c.states.Delete(d.seq())
	if d.c.cfg.DoubleAck {
		return d.m.DoubleAck(ctx)
	}
	return d.m.Ack()
}

func (d *delivery) Retry(_ context.Context, after time.Duration, st consume.State) error {
	d.c.states.Put(d.seq(), retryState{st: st, delivered: d.before() + 1})
	return d.m.NakWithDelay(after)
}

// Requeue naks the message; this delivery is recorded as this process's
// own, so that it does not count as a failed attempt.
func (d *delivery) Requeue(context.Context) error {
	d.c.states.Put(d.seq(), retryState{st: d.State(), delivered: d.before() + 1})
	return d.m.Nak()
}

// DeadLetter publishes a copy with the failure headers and waits for the
// stream's ack before it terminates the original. Its Nats-Msg-Id is its
// dead-letter id ([DeadLetterID]), derived from the original's stream and
// sequence, so a repeat after a crash between the two steps is dropped by
// the dead-letter stream's duplicate window; the original's Nats-Msg-Id
// is kept in consume.HeaderOriginalID.
func (d *delivery) DeadLetter(ctx context.Context, dl consume.DeadLetter) error {
	out := nats.NewMsg(d.c.cfg.DeadLetterSubject)
	for k, v := range d.m.Headers() {
		out.Header[k] = append([]string(nil), v...)
	}
	stream := d.c.cfg.Stream
	if d.md != nil {
		stream = d.md.Stream
		out.Header.Set(HeaderDeliveries, strconv.FormatUint(d.md.NumDelivered, 10))
	}
	dl.DeadLetterID = DeadLetterID(stream, d.seq())
	for k, v := range dl.Headers() {
		out.Header.Set(k, v)
	}
	out.Header.Set(HeaderStream, stream)
	out.Header.Set(HeaderStreamSeq, strconv.FormatUint(d.seq(), 10))
	out.Header.Set(jetstream.MsgIDHeader, dl.DeadLetterID)
	out.Data = d.m.Data()
	if _, err := d.c.js.PublishMsg(ctx, out); err != nil {
		return idem.Retryable(fmt.Errorf("idemnats: publish dead letter to %q: %w", d.c.cfg.DeadLetterSubject, err))
	}
	d.c.states.Delete(d.seq())
	// Plain Term, not TermWithReason: servers before 2.10 ignore a TERM
	// that carries a reason. The reason travels in the dead letter.
	return d.m.Term()
}

// DeadLetterID returns the dead-letter id of the message at seq in
// stream: the Nats-Msg-Id of its dead letter, and its
// consume.HeaderDeadLetterID.
func DeadLetterID(stream string, seq uint64) string {
	return consume.DeadLetterID("nats", stream, strconv.FormatUint(seq, 10))
}

// retryState is the state this process recorded when it settled the
// delivered-th delivery of a message.
type retryState struct {
	st        consume.State
	delivered int
}
