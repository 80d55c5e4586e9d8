package idemsqs

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/shared/bounded"
)

// AttrID is the message attribute that carries the producer's message id:
// the dedupe key. [Publish] sets it.
const AttrID = "idem-id"

// AttrOriginalID is the dead-letter attribute holding the SQS MessageId of
// the message that was dead-lettered.
const AttrOriginalID = "x-idem-original-id"

// FIFOWindow is SQS's deduplication interval on FIFO queues: a send with a
// MessageDeduplicationId seen in the last FIFOWindow is accepted and
// dropped.
const FIFOWindow = 5 * time.Minute

// MaxVisibility is the longest visibility timeout SQS accepts: a retry
// delay is capped to it.
const MaxVisibility = 12 * time.Hour

// Config configures a [Consumer]. The embedded consume.Config is the
// engine's: Name (required: the dedupe scope and the consumer named in dead
// letters), Retry (nil: full jitter, base 1s, cap 1m, 5 attempts, applied
// with ChangeMessageVisibility), Retention (default 24h; it must cover the
// redelivery horizon, see [Consumer.Ping]), Fingerprint, MaxErrorBytes,
// Hooks, Logger and Now, with the meanings and defaults documented there.
// MissingID has no effect: every SQS message has an id (see [Consumer]).
type Config struct {
	consume.Config
	// QueueURL is the work queue. Required.
	QueueURL string
	// DeadLetterQueueURL receives dead letters. Default: the work queue's
	// native redrive policy target, looked up by Ping and Run. One of the
	// two is required. The dead-letter queue of a FIFO queue is FIFO too.
	DeadLetterQueueURL string
	// Process runs the handler idempotently for each message. Required.
	Process consume.ProcessFunc
	// BatchProcess, when set, handles each receive of a standard queue as
	// one batch: one dedupe round trip and one transaction (a closure over
	// a SQL store's ProcessBatch, consume.TransactionalBatch). A failed
	// batch falls back to Process one message at a time. FIFO queues are
	// always handled one message at a time, in order per group.
	BatchProcess consume.BatchProcessFunc
	// MaxMessages is how many messages one receive asks for, 1 to 10.
	// Default 10.
	MaxMessages int
	// WaitTime is the long-polling wait of a receive, up to 20s. Default 20s.
	WaitTime time.Duration
	// Visibility is the visibility timeout the heartbeat keeps renewing
	// while a message is handled. Default: the queue's VisibilityTimeout.
	Visibility time.Duration
	// Heartbeat is how often a received message's visibility is extended
	// by Visibility while it is handled. Default Visibility/3; negative
	// disables it.
	Heartbeat time.Duration
	// Concurrency is the number of receive loops, each handling its own
	// receives. Default 2.
	Concurrency int
}

// Consumer consumes one SQS queue through the shared consume.Engine.
//
// The dedupe key of a message is its AttrID message attribute, else its
// FIFO MessageDeduplicationId, else its SQS MessageId. The last is weaker:
// SQS gives a producer's retried send a new MessageId, so only broker-side
// redeliveries are deduplicated for such messages, not producer-side
// duplicates. Publish with [Publish] to set AttrID.
type Consumer struct {
	client *sqs.Client
	cfg    Config
	engine *consume.Engine
	states *bounded.Map[string, consume.State]
}

// maxStates bounds the in-process retry-state cache.
const maxStates = 10000

// NewConsumer checks cfg and returns a Consumer; it does no I/O.
// [Consumer.Ping], and [Consumer.Run] before it starts, read the queue's
// attributes and check them.
func NewConsumer(client *sqs.Client, cfg *Config) (*Consumer, error) {
	if client == nil || cfg == nil {
		return nil, fmt.Errorf("%w: idemsqs: NewConsumer needs an SQS client and a config", idem.ErrInvalidConfig)
	}
	c := &Consumer{client: client, cfg: *cfg, states: bounded.New[string, consume.State](maxStates)}
	if c.cfg.QueueURL == "" {
		return nil, fmt.Errorf("%w: idemsqs: QueueURL is required", idem.ErrInvalidConfig)
	}
	if isFIFO(c.cfg.QueueURL) && c.cfg.DeadLetterQueueURL != "" && !isFIFO(c.cfg.DeadLetterQueueURL) {
		return nil, fmt.Errorf("%w: idemsqs: the dead-letter queue of FIFO queue %s must be FIFO, got %s", idem.ErrInvalidConfig, c.cfg.QueueURL, c.cfg.DeadLetterQueueURL)
	}
	if c.cfg.MaxMessages <= 0 || c.cfg.MaxMessages > 10 {
		c.cfg.MaxMessages = 10
	}
	if c.cfg.WaitTime <= 0 || c.cfg.WaitTime > 20*time.Second {
		c.cfg.WaitTime = 20 * time.Second
	}
	if c.cfg.Visibility != 0 && (c.cfg.Visibility < time.Second || c.cfg.Visibility > MaxVisibility) {
		return nil, fmt.Errorf("%w: idemsqs: Visibility must be between 1s and %v (SQS counts it in seconds), got %v", idem.ErrInvalidConfig, MaxVisibility, c.cfg.Visibility)
	}
	if c.cfg.Concurrency <= 0 {
		c.cfg.Concurrency = 2
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

// Engine returns the consumer's engine.
func (c *Consumer) Engine() *consume.Engine { return c.engine }

// QueueInfo is what the consumer reads from a queue's attributes.
type QueueInfo struct {
	// FIFO is set for a FIFO queue.
	FIFO bool
	// Visibility is the queue's VisibilityTimeout.
	Visibility time.Duration
	// Retention is the queue's MessageRetentionPeriod; zero when the
	// server does not report it.
	Retention time.Duration
	// MaxReceiveCount and DeadLetterTargetARN are the native redrive
	// policy's; zero and "" without one.
	MaxReceiveCount     int
	DeadLetterTargetARN string
}

// ReadQueueInfo reads the attributes of the queue at url.
func ReadQueueInfo(ctx context.Context, client *sqs.Client, url string) (QueueInfo, error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		return QueueInfo{}, fmt.Errorf("idemsqs: queue %s: %w", url, err)
	}
	return parseQueueInfo(url, out.Attributes)
}

func parseQueueInfo(url string, a map[string]string) (QueueInfo, error) {
	info := QueueInfo{FIFO: a["FifoQueue"] == "true" || isFIFO(url)}
	secs := func(name string) (time.Duration, error) {
		v, ok := a[name]
		if !ok || v == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("idemsqs: queue %s: attribute %s is %q, not a number of seconds", url, name, v)
		}
		return time.Duration(n) * time.Second, nil
	}
	var err error
	if info.Visibility, err = secs("VisibilityTimeout"); err != nil {
		return info, err
	}
	if info.Retention, err = secs("MessageRetentionPeriod"); err != nil {
		return info, err
	}
	if rp := a["RedrivePolicy"]; rp != "" {
		n, arn, err := parseRedrivePolicy(rp)
		if err != nil {
			return info, fmt.Errorf("idemsqs: queue %s: %w", url, err)
		}
		info.MaxReceiveCount, info.DeadLetterTargetARN = n, arn
	}
	return info, nil
}

// Ping reads the work queue's attributes and checks them against the
// configuration, as Run does before it starts:
//
//   - a native redrive policy whose maxReceiveCount is not above
//     max_attempts is refused: SQS would move the message to its
//     dead-letter queue before idem dead-letters it, without the metadata;
//   - the redelivery horizon, maxReceiveCount (max_attempts without a
//     redrive policy) × the visibility timeout + max_attempts ×
//     max_backoff (+ the FIFO deduplication window on a FIFO queue), must
//     fit in the dedupe Retention and in the queue's MessageRetentionPeriod
//     (when the server reports it): the error names the numbers;
//   - the dead-letter queue (Config.DeadLetterQueueURL, or the redrive
//     policy's target) must exist.
func (c *Consumer) Ping(ctx context.Context) error {
	_, err := c.prepare(ctx)
	return err
}

// prepare is Ping: it returns the effective queue settings.
func (c *Consumer) prepare(ctx context.Context) (run, error) {
	info, err := ReadQueueInfo(ctx, c.client, c.cfg.QueueURL)
	if err != nil {
		return run{}, err
	}
	r := run{info: info, visibility: c.cfg.Visibility, dlq: c.cfg.DeadLetterQueueURL}
	if r.visibility == 0 {
		r.visibility = info.Visibility
	}
	if r.visibility <= 0 {
		r.visibility = 30 * time.Second // SQS's default
	}
	if err := c.check(info, r.visibility); err != nil {
		return run{}, err
	}
	if c.cfg.Heartbeat >= r.visibility {
		return run{}, fmt.Errorf("%w: idemsqs: Heartbeat %v is not shorter than the visibility timeout %v: a slow handler's message would become visible to other consumers between two heartbeats",
			idem.ErrInvalidConfig, c.cfg.Heartbeat, r.visibility)
	}
	if r.dlq == "" {
		if info.DeadLetterTargetARN == "" {
			return run{}, fmt.Errorf("%w: idemsqs: queue %s has no redrive policy: set DeadLetterQueueURL", idem.ErrInvalidConfig, c.cfg.QueueURL)
		}
		r.dlq, err = queueURLFromARN(ctx, c.client, info.DeadLetterTargetARN)
		if err != nil {
			return run{}, err
		}
	}
	if _, err := c.client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(r.dlq)}); err != nil {
		return run{}, fmt.Errorf("idemsqs: dead-letter queue %s: %w", r.dlq, err)
	}
	return r, nil
}

// check applies the rules of [Consumer.Ping] to the queue's attributes.
func (c *Consumer) check(info QueueInfo, visibility time.Duration) error {
	p := c.engine.Policy()
	if info.MaxReceiveCount > 0 && p.MaxAttempts > 0 && info.MaxReceiveCount <= p.MaxAttempts {
		return fmt.Errorf("%w: idemsqs: queue %s has a redrive policy with maxReceiveCount %d, not above max_attempts %d: SQS would move a failing message to its dead-letter queue before idem dead-letters it with its metadata; raise maxReceiveCount above %d",
			idem.ErrInvalidConfig, c.cfg.QueueURL, info.MaxReceiveCount, p.MaxAttempts, p.MaxAttempts)
	}
	h := horizon(info, visibility, p.MaxAttempts, p.Cap)
	if info.Retention > 0 && info.Retention < h.D {
		return fmt.Errorf("%w: idemsqs: queue %s keeps messages %v (MessageRetentionPeriod), shorter than the redelivery horizon %v (%s): SQS would delete a retried message before idem dead-letters it; raise the retention above %v",
			idem.ErrInvalidConfig, c.cfg.QueueURL, info.Retention, h.D, h.Name, h.D)
	}
	return consume.CheckRetention(c.cfg.Retention, p.MaxAttempts, p.Cap, h)
}

// horizon is how long after its first receive a message may still be
// delivered: every receive up to maxReceiveCount (max_attempts without a
// redrive policy) may outlive its visibility timeout, the retries wait up
// to max_backoff each, and on a FIFO queue a producer's retry inside the
// deduplication window is dropped by SQS only within that window.
func horizon(info QueueInfo, visibility time.Duration, maxAttempts int, maxBackoff time.Duration) consume.Window {
	receives, what := info.MaxReceiveCount, "maxReceiveCount"
	if receives <= 0 {
		receives, what = maxAttempts, "max_attempts"
	}
	w := consume.Window{
		Name: fmt.Sprintf("%s %d × visibility %v + max_attempts %d × max_backoff %v", what, receives, visibility, maxAttempts, maxBackoff),
		D:    consume.Horizon(receives, visibility).D + consume.Horizon(maxAttempts, maxBackoff).D,
	}
	if info.FIFO {
		w.Name += fmt.Sprintf(" + FIFO deduplication window %v", FIFOWindow)
		w.D += FIFOWindow
	}
	return w
}

// run is what Run found at start.
type run struct {
	info       QueueInfo
	visibility time.Duration
	dlq        string
}

// Run checks the queue as [Consumer.Ping] does, then receives until ctx
// ends and returns nil then, or the error of the check. Messages it was
// handling when ctx ended and did not delete become visible again after
// their visibility timeout and are deduped. Receive errors are logged and
// retried with backoff.
func (c *Consumer) Run(ctx context.Context) error {
	r, err := c.prepare(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	hb := c.cfg.Heartbeat
	if hb == 0 {
		hb = r.visibility / 3
	}
	s := &session{c: c, run: r, heartbeat: hb}
	var wg sync.WaitGroup
	for range c.cfg.Concurrency {
		wg.Go(func() { s.loop(ctx) })
	}
	wg.Wait()
	return nil
}

// session is what the receive loops of one Run share.
type session struct {
	c         *Consumer
	run       run
	heartbeat time.Duration
}

// loop receives and handles until ctx ends.
func (s *session) loop(ctx context.Context) {
	backoff := (&retry.Policy{Base: 100 * time.Millisecond, Cap: 10 * time.Second, MaxAttempts: -1}).WithDefaults()
	failures := 0
	for ctx.Err() == nil {
		out, err := s.c.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(s.c.cfg.QueueURL),
			MaxNumberOfMessages:         int32(s.c.cfg.MaxMessages),
			WaitTimeSeconds:             int32(s.c.cfg.WaitTime / time.Second),
			VisibilityTimeout:           int32(s.run.visibility / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := backoff.Delay(failures)
			failures++
			s.c.cfg.Logger.Warn("idem: sqs receive failed; retrying", "consumer", s.c.cfg.Name, "queue", s.c.cfg.QueueURL, "err", err, "in", d)
			if retry.Sleep(ctx, d) != nil {
				return
			}
			continue
		}
		failures = 0
		if len(out.Messages) > 0 {
			s.handle(ctx, out.Messages)
		}
	}
}

// handle runs the engine over one receive, heartbeating the messages'
// visibility while they are handled, and deletes the acked ones in one
// DeleteMessageBatch after the commit.
func (s *session) handle(ctx context.Context, msgs []types.Message) {
	b := &batch{s: s, ds: make([]*delivery, len(msgs))}
	for i, m := range msgs {
		b.ds[i] = &delivery{b: b, m: m}
	}
	done := make(chan struct{})
	var hb sync.WaitGroup
	if s.heartbeat > 0 {
		hb.Go(func() { b.beat(ctx, done) })
	}
	switch {
	case s.run.info.FIFO:
		b.inOrder(ctx)
	case s.c.cfg.BatchProcess != nil:
		ds := make([]consume.Delivery, len(b.ds))
		for i, d := range b.ds {
			ds[i] = d
		}
		_, _ = s.c.engine.HandleBatch(ctx, ds, s.c.cfg.BatchProcess)
	default:
		for _, d := range b.ds {
			_, _ = s.c.engine.Handle(ctx, d)
		}
	}
	b.deleteAcked(ctx)
	close(done)
	hb.Wait()
}

// batch is the messages of one receive.
type batch struct {
	s  *session
	ds []*delivery
}

// inOrder handles a FIFO receive one message at a time: a message that is
// not settled for good (retried, requeued, abandoned) holds back the rest
// of its group, whose messages are hidden as long as it is.
func (b *batch) inOrder(ctx context.Context) {
	held := map[string]time.Duration{}
	for _, d := range b.ds {
		g := d.m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if delay, ok := held[g]; ok {
			d.release(ctx, delay)
			continue
		}
		out, _ := b.s.c.engine.Handle(ctx, d)
		switch out {
		case idem.Processed, idem.Duplicate, idem.DeadLettered:
		default:
			held[g] = d.retryDelay()
		}
	}
}

// beat extends the visibility of the batch's unsettled messages every
// heartbeat until done closes.
func (b *batch) beat(ctx context.Context, done <-chan struct{}) {
	t := time.NewTicker(b.s.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, d := range b.ds {
			if err := d.extend(ctx, b.s.run.visibility); err != nil && ctx.Err() == nil {
				b.s.c.cfg.Logger.Warn("idem: sqs visibility heartbeat failed", "consumer", b.s.c.cfg.Name, "id", d.ID(), "err", err)
			}
		}
	}
}

// deleteAcked deletes the acked messages with DeleteMessageBatch. A
// message whose delete fails becomes visible again and its redelivery is
// deduped.
func (b *batch) deleteAcked(ctx context.Context) {
	var entries []types.DeleteMessageBatchRequestEntry
	for i, d := range b.ds {
		d.mu.Lock()
		if d.acked {
			entries = append(entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: d.m.ReceiptHandle})
		}
		d.mu.Unlock()
	}
	if len(entries) == 0 {
		return
	}
	// The messages are committed: delete them even when ctx has ended.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	out, err := b.s.c.client.DeleteMessageBatch(dctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(b.s.c.cfg.QueueURL), Entries: entries})
	log := b.s.c.cfg.Logger
	if err != nil {
		log.Warn("idem: sqs delete of processed messages failed; they will be redelivered and deduped", "consumer", b.s.c.cfg.Name, "count", len(entries), "err", err)
		return
	}
	for _, f := range out.Failed {
		log.Warn("idem: sqs delete of a processed message failed; it will be redelivered and deduped", "consumer", b.s.c.cfg.Name,
			"entry", aws.ToString(f.Id), "code", aws.ToString(f.Code), "err", aws.ToString(f.Message))
	}
}

// delivery adapts an SQS message to consume.Delivery.
type delivery struct {
	b     *batch
	m     types.Message
	delay time.Duration
	// mu guards settled and acked, and serializes the heartbeat's
	// visibility changes with the settling ones, so that a heartbeat never
	// overwrites a retry's delay.
	mu      sync.Mutex
	settled bool // no more heartbeats
	acked   bool // to delete after the commit
}

// extend renews the visibility of d unless it is settled.
func (d *delivery) extend(ctx context.Context, v time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.settled {
		return nil
	}
	return d.visibility(ctx, v)
}

// settle marks d settled, acked or not.
func (d *delivery) settle(acked bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.settled, d.acked = true, acked
}

// hide settles d, not acked, and hides it for v.
func (d *delivery) hide(ctx context.Context, v time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.settled = true
	return d.visibility(ctx, v)
}

// ID is the AttrID attribute, else the FIFO MessageDeduplicationId, else
// the SQS MessageId (see [Consumer]).
func (d *delivery) ID() string {
	if a, ok := d.m.MessageAttributes[AttrID]; ok && aws.ToString(a.StringValue) != "" {
		return aws.ToString(a.StringValue)
	}
	if id := d.m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]; id != "" {
		return id
	}
	return aws.ToString(d.m.MessageId)
}

func (d *delivery) Body() []byte { return []byte(aws.ToString(d.m.Body)) }

// Origin is the queue the message was first sent to: carried in an
// attribute once it has been dead-lettered and redriven.
func (d *delivery) Origin() string {
	if o, ok := attr(d.m.MessageAttributes, consume.HeaderOrigin); ok {
		return o
	}
	return d.b.s.c.cfg.QueueURL
}

// State is the retry state this process recorded at the message's last
// failure (SQS cannot rewrite a message's attributes on a retry, so the
// failure attributes a dead letter carries are not read back, also not
// from a message [MoveBack] moved back). After a restart, or for a
// message another process failed, it falls back to the message's
// ApproximateReceiveCount: every earlier receive counts as a failed
// attempt, so a message can be dead-lettered sooner, never later.
func (d *delivery) State() consume.State {
	if st, ok := d.b.s.c.states.Get(aws.ToString(d.m.MessageId)); ok {
		return st
	}
	var st consume.State
	if n, err := strconv.Atoi(d.m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]); err == nil && n > 1 {
		st.Attempts = n - 1
	}
	return st
}

// Ack marks the message for the DeleteMessageBatch that follows the
// receive's handling.
func (d *delivery) Ack(context.Context) error {
	d.b.s.c.states.Delete(aws.ToString(d.m.MessageId))
	d.settle(true)
	return nil
}

// Retry hides the message for after (ChangeMessageVisibility), at least a
// second (SQS counts visibility in seconds) and at most MaxVisibility; SQS
// then delivers it again.
func (d *delivery) Retry(ctx context.Context, after time.Duration, st consume.State) error {
	d.b.s.c.states.Put(aws.ToString(d.m.MessageId), st)
	d.delay = min(max(after, time.Second), MaxVisibility)
	return d.hide(ctx, d.delay)
}

// Requeue makes the message visible again at once.
func (d *delivery) Requeue(ctx context.Context) error {
	return d.hide(ctx, 0)
}

// retryDelay is how long a retried message stays hidden.
func (d *delivery) retryDelay() time.Duration {
	if d.delay > 0 {
		return d.delay
	}
	return time.Second
}

// release hands a message of a held-back FIFO group back, hidden for delay.
func (d *delivery) release(ctx context.Context, delay time.Duration) {
	if err := d.hide(ctx, delay); err != nil && ctx.Err() == nil {
		d.b.s.c.cfg.Logger.Warn("idem: sqs release of a held-back FIFO message failed", "consumer", d.b.s.c.cfg.Name, "id", d.ID(), "err", err)
	}
}

func (d *delivery) visibility(ctx context.Context, v time.Duration) error {
	_, err := d.b.s.c.client.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(d.b.s.c.cfg.QueueURL), ReceiptHandle: d.m.ReceiptHandle, VisibilityTimeout: int32(v / time.Second),
	})
	if err != nil {
		return idem.Retryable(fmt.Errorf("idemsqs: change visibility of %s: %w", aws.ToString(d.m.MessageId), err))
	}
	return nil
}

// DeadLetter sends a copy with the failure metadata as message attributes
// to the dead-letter queue, then deletes the original. On a FIFO
// dead-letter queue the copy's MessageDeduplicationId is derived from the
// original's MessageId, so a repeat after a crash between the two steps is
// dropped by SQS within its deduplication window.
func (d *delivery) DeadLetter(ctx context.Context, dl consume.DeadLetter) error {
	s := d.b.s
	in := &sqs.SendMessageInput{
		QueueUrl:          aws.String(s.run.dlq),
		MessageBody:       d.m.Body,
		MessageAttributes: deadLetterAttributes(d.m, dl, d.Origin(), s.c.cfg.Logger),
	}
	if isFIFO(s.run.dlq) {
		g := d.m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if g == "" {
			g = "idem-dead-letters"
		}
		in.MessageGroupId = aws.String(g)
		in.MessageDeduplicationId = aws.String("idem-dead-letter:" + aws.ToString(d.m.MessageId))
	}
	if _, err := s.c.client.SendMessage(ctx, in); err != nil {
		return idem.Retryable(fmt.Errorf("idemsqs: send dead letter to %s: %w", s.run.dlq, err))
	}
	s.c.states.Delete(aws.ToString(d.m.MessageId))
	d.settle(false)
	if _, err := s.c.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(s.c.cfg.QueueURL), ReceiptHandle: d.m.ReceiptHandle}); err != nil {
		return fmt.Errorf("idemsqs: delete dead-lettered %s: %w", aws.ToString(d.m.MessageId), err)
	}
	return nil
}

// maxAttributes is SQS's limit of message attributes per message.
const maxAttributes = 10

// deadLetterAttributes returns m's attributes with dl's metadata, the
// origin and the original MessageId on top, within SQS's limit of ten:
// the metadata and AttrID first, then the producer's other attributes as
// long as there is room (those left out are logged).
func deadLetterAttributes(m types.Message, dl consume.DeadLetter, origin string, log interface {
	Warn(msg string, args ...any)
}) map[string]types.MessageAttributeValue {
	out := map[string]types.MessageAttributeValue{}
	h := dl.Headers()
	h[consume.HeaderOrigin] = origin
	h[AttrOriginalID] = aws.ToString(m.MessageId)
	for k, v := range h {
		out[k] = stringAttr(v)
	}
	if v, ok := m.MessageAttributes[AttrID]; ok {
		out[AttrID] = v
	}
	var dropped []string
	for k, v := range m.MessageAttributes {
		if _, ok := out[k]; ok || strings.HasPrefix(k, "x-idem-") {
			continue
		}
		if len(out) >= maxAttributes {
			dropped = append(dropped, k)
			continue
		}
		out[k] = v
	}
	if len(dropped) > 0 {
		log.Warn("idem: sqs dead letter cannot carry all of the message's attributes (SQS allows 10)", "id", aws.ToString(m.MessageId), "dropped", dropped)
	}
	return out
}

func stringAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// attr returns a message attribute's string value.
func attr(a map[string]types.MessageAttributeValue, name string) (string, bool) {
	v, ok := a[name]
	if !ok || v.StringValue == nil {
		return "", false
	}
	return *v.StringValue, true
}

// isFIFO reports whether a queue URL or name names a FIFO queue.
func isFIFO(url string) bool { return strings.HasSuffix(url, ".fifo") }
