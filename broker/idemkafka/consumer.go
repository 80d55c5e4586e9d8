package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultIDHeader is the record header that carries the producer's
// message id.
const DefaultIDHeader = "idem-id"

// Headers a dead letter carries besides the consume.Header* failure
// metadata: where the original record was.
const (
	HeaderTopic     = "x-idem-topic"
	HeaderPartition = "x-idem-partition"
	HeaderOffset    = "x-idem-offset"
)

// Config configures a [Consumer]. The embedded consume.Config is the
// engine's: Name (required: the dedupe scope and the consumer named in dead
// letters), Retry (the in-process backoff of failed records; nil: full
// jitter, base 1s, cap 1m, 5 attempts), Retention (default 24h; it must
// cover the redelivery horizon, see [NewConsumer]), MissingID (for records
// without an id header when NoOffsetKey is set), Fingerprint,
// MaxErrorBytes, Hooks, Logger and Now, with the meanings and defaults
// documented there.
type Config struct {
	consume.Config
	// Group is the Kafka consumer group. Default Name.
	Group string
	// Topics to consume. Required.
	Topics []string
	// ClientOpts are the franz-go options for the consumer's client (seed
	// brokers, TLS, SASL, ...). The consumer adds the group, the topics,
	// manual commits and its rebalance callbacks after them. The same
	// client produces dead letters; franz-go's producer is idempotent
	// unless DisableIdempotentWrite is among these options.
	ClientOpts []kgo.Opt
	// BatchProcess handles one partition's fetch idempotently: typically
	// a closure over a SQL store's ProcessBatch (consume.TransactionalBatch),
	// which inserts every dedupe record in one round trip and runs the
	// effects of the fresh ones in the same transaction. msgs[i] belongs to
	// ds[i]; [RecordOf] returns a delivery's record. A record that fails is
	// handled again alone, in a batch of one. Required.
	BatchProcess consume.BatchProcessFunc
	// IDHeader names the id header. Default DefaultIDHeader.
	IDHeader string
	// NoOffsetKey turns off keying a record without an id header by
	// topic-partition-offset. That key is weaker than a producer id: it
	// catches redeliveries (rebalances, restarts before the offset commit)
	// but not a producer that wrote the same event twice, which lands at
	// two offsets. With NoOffsetKey such a record follows MissingID:
	// dead-lettered (consume.DeadLetterMissingID, the zero value) or keyed
	// by the SHA-256 of its value (consume.ContentKey).
	NoOffsetKey bool
	// DeadLetterTopic receives records after max_attempts, a permanent
	// error or an id conflict. Default: the record's topic + ".dlq".
	DeadLetterTopic string
	// TopicRetention is how long a record can be re-read. Zero: read each
	// topic's retention.ms from the cluster at start; negative: leave it
	// out of the check (for example when committed offsets are never
	// reset).
	TopicRetention time.Duration
	// MaxPollRecords bounds one poll. Default 500.
	MaxPollRecords int
	// RevokeGrace is how long a revocation waits for an in-flight batch of
	// a revoked partition to finish before abandoning it. Default 5s.
	RevokeGrace time.Duration
	// ShutdownTimeout bounds what Run does after its context ends: commit
	// the offsets of what committed, leave the group and close the client.
	// Whatever is not done by then is abandoned (an unanswered leave ends
	// with the group's session timeout; uncommitted records are read again
	// and deduped) and Run returns. Default 10s.
	ShutdownTimeout time.Duration
}

type topicPartition struct {
	topic     string
	partition int32
}

// inflight is a partition batch being processed.
type inflight struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Consumer consumes Kafka topics in a consumer group, one BatchProcess
// call per partition fetch, and commits offsets only after the effects
// commit.
type Consumer struct {
	cfg    Config
	engine *consume.Engine
	policy retry.Policy

	mu       sync.Mutex
	stopping context.Context // the shutdown's, once Run's ctx has ended
	inflight map[topicPartition]*inflight
	revoked  map[topicPartition]bool
	pending  map[string]map[int32]kgo.EpochOffset
}

// NewConsumer checks cfg and returns a Consumer; it does no I/O (the
// client is created by [Consumer.Run]). It refuses (an error wrapping
// idem.ErrInvalidConfig that names both numbers) a dedupe retention
// shorter than max_attempts × max_backoff or than Config.TopicRetention,
// because a record re-read after its dedupe record expired would be
// processed twice. With TopicRetention zero, [Consumer.Ping] and Run read
// each topic's retention.ms and check it the same way.
func NewConsumer(cfg *Config) (*Consumer, error) {
	if cfg == nil || cfg.BatchProcess == nil || len(cfg.Topics) == 0 {
		return nil, fmt.Errorf("%w: idemkafka: NewConsumer needs a config with Topics and BatchProcess", idem.ErrInvalidConfig)
	}
	c := &Consumer{cfg: *cfg, inflight: map[topicPartition]*inflight{}, revoked: map[topicPartition]bool{}, pending: map[string]map[int32]kgo.EpochOffset{}}
	if c.cfg.Group == "" {
		c.cfg.Group = c.cfg.Name
	}
	if c.cfg.IDHeader == "" {
		c.cfg.IDHeader = DefaultIDHeader
	}
	if c.cfg.MaxPollRecords <= 0 {
		c.cfg.MaxPollRecords = 500
	}
	if c.cfg.RevokeGrace <= 0 {
		c.cfg.RevokeGrace = 5 * time.Second
	}
	if c.cfg.ShutdownTimeout <= 0 {
		c.cfg.ShutdownTimeout = 10 * time.Second
	}
	engine, err := consume.New(c.one, &c.cfg.Config)
	if err != nil {
		return nil, err
	}
	c.cfg.Config = engine.Config() // the engine's defaults filled in
	c.engine, c.policy = engine, engine.Policy()
	var windows []consume.Window
	if c.cfg.TopicRetention > 0 {
		windows = append(windows, consume.Window{Name: "configured topic retention", D: c.cfg.TopicRetention})
	}
	if err := consume.CheckRetention(c.cfg.Retention, c.policy.MaxAttempts, c.policy.Cap, windows...); err != nil {
		return nil, err
	}
	return c, nil
}

// Engine returns the engine that handles the records (retries and dead
// letters).
func (c *Consumer) Engine() *consume.Engine { return c.engine }

// Ping connects to the cluster with Config.ClientOpts (without joining the
// group) and, when Config.TopicRetention is zero, reads every topic's
// retention.ms and checks the dedupe window against it, as Run does before
// it starts. The error says which broker, topic or window is wrong.
func (c *Consumer) Ping(ctx context.Context) error {
	cl, err := kgo.NewClient(c.cfg.ClientOpts...)
	if err != nil {
		return fmt.Errorf("idemkafka: client: %w", err)
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return fmt.Errorf("idemkafka: cannot reach the cluster: %w", err)
	}
	return c.checkRetention(ctx, cl)
}

// checkRetention reads the topics' retention (unless configured) and
// checks the dedupe window against it.
func (c *Consumer) checkRetention(ctx context.Context, cl *kgo.Client) error {
	if c.cfg.TopicRetention != 0 {
		return nil // checked by NewConsumer
	}
	windows, err := c.retentionWindows(ctx, cl)
	if err != nil {
		return err
	}
	return consume.CheckRetention(c.cfg.Retention, c.policy.MaxAttempts, c.policy.Cap, windows...)
}

// Run checks the topics' retention as [Consumer.Ping] does, joins the
// group and consumes until ctx ends, then commits what committed, leaves
// the group and closes its client, all within Config.ShutdownTimeout (see
// [Consumer.shutdown]); a Consumer runs once. It returns nil when ctx ends
// (also during the check), or the error of the check.
func (c *Consumer) Run(ctx context.Context) error {
	opts := append([]kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, c.cfg.ClientOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
	)
	if c.cfg.TopicRetention == 0 {
		if err := c.Ping(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("idemkafka: client: %w", err)
	}
	defer c.shutdown(ctx, cl)
	for {
		fetches := cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			c.cfg.Logger.Warn("idem: kafka fetch error", "consumer", c.cfg.Name, "topic", topic, "partition", p, "err", err)
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				c.partition(ctx, cl, topicPartition{p.Topic, p.Partition}, p.Records)
			}
		})
		if ctx.Err() == nil {
			c.commit(ctx, cl, c.takePending(nil))
		}
	}
}

// shutdown commits what committed, leaves the group and closes cl, within
// Config.ShutdownTimeout in all, on a context of its own (ctx has ended).
// A group that does not answer cannot hold it longer: franz-go's Close
// waits for the leave without a bound, so the leave gets the shutdown's
// context, the revocation it triggers commits on it too, and when the
// bound passes shutdown returns and lets the close finish in the
// background, where the ended context makes it quick.
func (c *Consumer) shutdown(ctx context.Context, cl *kgo.Client) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.ShutdownTimeout)
	defer cancel()
	c.mu.Lock()
	c.stopping = sctx
	c.mu.Unlock()
	c.commit(sctx, cl, c.takePending(nil))
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		cl.LeaveGroupContext(sctx) // a canceled context makes Close skip the wait
		cl.Close()
	}()
	select {
	case <-closed:
	case <-sctx.Done():
		c.cfg.Logger.Warn("idem: kafka consumer did not commit and leave its group within ShutdownTimeout; abandoning the rest (the group rebalances after its session timeout, uncommitted records are read again and deduped)",
			"consumer", c.cfg.Name, "group", c.cfg.Group, "timeout", c.cfg.ShutdownTimeout)
	}
}

// bounded returns ctx, also canceled when the shutdown's time is up.
func (c *Consumer) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	c.mu.Lock()
	stopping := c.stopping
	c.mu.Unlock()
	if stopping == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(stopping, cancel)
	return ctx, func() { stop(); cancel() }
}

// partition processes one partition's records unless it was revoked, and
// records the offset after the highest contiguous settled record.
func (c *Consumer) partition(ctx context.Context, cl *kgo.Client, tp topicPartition, recs []*kgo.Record) {
	c.mu.Lock()
	if c.revoked[tp] {
		c.mu.Unlock()
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	f := &inflight{cancel: cancel, done: make(chan struct{})}
	c.inflight[tp] = f
	c.mu.Unlock()

	n := c.process(pctx, cl, recs)

	c.mu.Lock()
	delete(c.inflight, tp)
	if n > 0 {
		last := recs[n-1]
		if c.pending[tp.topic] == nil {
			c.pending[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		c.pending[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: last.LeaderEpoch, Offset: last.Offset + 1}
	}
	c.mu.Unlock()
	close(f.done)
	cancel()
}

// process runs recs through the engine as one batch and returns how many,
// from the first, were settled (processed, duplicate or dead-lettered)
// before ctx ended. The records are in-process deliveries: when the batch
// fails, the engine settles them one at a time, in order, retrying a
// failing record here until it is dead-lettered.
func (c *Consumer) process(ctx context.Context, cl *kgo.Client, recs []*kgo.Record) int {
	ds := make([]consume.Delivery, len(recs))
	for i, r := range recs {
		ds[i] = &delivery{c: c, cl: cl, r: r}
	}
	outs, _ := c.engine.HandleBatch(ctx, ds, c.batch) // settle failures are retried in process
	for i, out := range outs {
		switch out {
		case idem.Processed, idem.Duplicate, idem.DeadLettered:
		default:
			return i
		}
	}
	return len(outs)
}

// batch runs the user's BatchProcess, retrying it as a whole while the
// store is out (idem.Retryable, idem.ErrCommitUnknown: not counted toward
// max_attempts). Any other error goes back to the engine, which handles the
// records one at a time.
func (c *Consumer) batch(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
	for failures := 0; ; failures++ {
		res, err := c.cfg.BatchProcess(ctx, msgs, ds)
		if err == nil || ctx.Err() != nil || (!idem.IsRetryable(err) && !errors.Is(err, idem.ErrCommitUnknown)) {
			return res, err
		}
		if retry.Sleep(ctx, c.policy.DelayFor(failures, err)) != nil {
			return nil, err
		}
	}
}

// one is the engine's ProcessFunc: a batch of one.
func (c *Consumer) one(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
	res, err := c.cfg.BatchProcess(ctx, []idem.Message{msg}, []consume.Delivery{d})
	if err != nil {
		return "", err
	}
	if len(res) != 1 {
		return "", fmt.Errorf("idemkafka: BatchProcess returned %d results for 1 messages", len(res))
	}
	return res[0], nil
}

// takePending removes and returns the pending offsets of the given
// partitions (all when only is nil).
func (c *Consumer) takePending(only map[string][]int32) map[string]map[int32]kgo.EpochOffset {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]map[int32]kgo.EpochOffset{}
	if only == nil {
		out, c.pending = c.pending, map[string]map[int32]kgo.EpochOffset{}
		return out
	}
	for topic, ps := range only {
		for _, p := range ps {
			if eo, ok := c.pending[topic][p]; ok {
				if out[topic] == nil {
					out[topic] = map[int32]kgo.EpochOffset{}
				}
				out[topic][p] = eo
				delete(c.pending[topic], p)
			}
		}
	}
	return out
}

// commit commits offsets whose records' effects have committed. A failed
// commit only means those records are read again and deduped.
func (c *Consumer) commit(ctx context.Context, cl *kgo.Client, offsets map[string]map[int32]kgo.EpochOffset) {
	if len(offsets) == 0 {
		return
	}
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			c.cfg.Logger.Warn("idem: kafka offset commit failed; the records will be read again and deduped", "consumer", c.cfg.Name, "err", err)
		}
	})
}

func (c *Consumer) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, ps := range assigned {
		for _, p := range ps {
			delete(c.revoked, topicPartition{topic, p})
		}
	}
}

// onRevoked lets in-flight batches of the revoked partitions finish for
// RevokeGrace, abandons them after that, and commits what committed, so
// that the new owner starts after it and dedupes the rest.
func (c *Consumer) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	c.stop(revoked)
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	c.commit(ctx, cl, c.takePending(revoked))
}

// onLost abandons the lost partitions' batches; their offsets can no
// longer be committed by this member.
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.stop(lost)
	c.takePending(lost)
}

func (c *Consumer) stop(parts map[string][]int32) {
	var flights []*inflight
	c.mu.Lock()
	for topic, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			c.revoked[tp] = true
			if f := c.inflight[tp]; f != nil {
				flights = append(flights, f)
			}
		}
	}
	c.mu.Unlock()
	grace := time.NewTimer(c.cfg.RevokeGrace)
	defer grace.Stop()
	for _, f := range flights {
		select {
		case <-f.done:
		case <-grace.C:
			f.cancel()
			<-f.done
		}
	}
	for _, f := range flights {
		f.cancel()
		<-f.done
	}
}

// delivery adapts a *kgo.Record to consume.Delivery. It is an in-process
// delivery: Kafka cannot redeliver one record, so the engine retries it
// here and Retry only keeps the state for the next attempt.
type delivery struct {
	c  *Consumer
	cl *kgo.Client
	r  *kgo.Record
	st consume.State
}

// RecordOf returns the Kafka record of a delivery a [Consumer] handed to
// BatchProcess (or to the engine's hooks), or nil for any other delivery.
func RecordOf(d consume.Delivery) *kgo.Record {
	if kd, ok := d.(*delivery); ok {
		return kd.r
	}
	return nil
}

func (*delivery) InProcess() {}

func (d *delivery) header(name string) (string, bool) {
	for _, h := range d.r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// ID is the producer's id header; without it, topic-partition-offset
// under OffsetKey, or "" (content key or dead letter).
func (d *delivery) ID() string {
	if id, ok := d.header(d.c.cfg.IDHeader); ok {
		return id
	}
	if !d.c.cfg.NoOffsetKey {
		return offsetKey(d.r.Topic, d.r.Partition, d.r.Offset)
	}
	return ""
}

// DeadLetterID returns the dead-letter id ([consume.HeaderDeadLetterID]) of
// the record at topic, partition and offset: the same record dead-lettered
// twice (read again after a crash, before its offset was committed)
// produces two dead-letter records with the same id. Consumers of the
// dead-letter topic dedupe on it, keeping one record per id: an idemkafka
// Consumer of that topic does with Config.IDHeader set to
// consume.HeaderDeadLetterID.
func DeadLetterID(topic string, partition int32, offset int64) string {
	return consume.DeadLetterID("kafka", topic, strconv.FormatInt(int64(partition), 10), strconv.FormatInt(offset, 10))
}

// offsetKey is "topic-partition-offset", hashed when it would exceed the
// key limit (topic names go up to 249 bytes).
func offsetKey(topic string, partition int32, offset int64) string {
	k := topic + "-" + strconv.FormatInt(int64(partition), 10) + "-" + strconv.FormatInt(offset, 10)
	if len(k) > idem.MaxKeyLen {
		k = "tpo-" + idem.ContentID([]byte(k))
	}
	return k
}

func (d *delivery) Body() []byte                  { return d.r.Value }
func (d *delivery) Origin() string                { return d.r.Topic }
func (d *delivery) State() consume.State          { return d.st }
func (d *delivery) Ack(context.Context) error     { return nil }
func (d *delivery) Requeue(context.Context) error { return nil }

func (d *delivery) Retry(_ context.Context, _ time.Duration, st consume.State) error {
	d.st = st
	return nil
}

// DeadLetter produces a copy of the record with the failure headers and
// the original topic, partition and offset, and waits for the broker. Its
// dead-letter id ([DeadLetterID]) comes from that topic, partition and
// offset: a record re-read after a crash, before its offset was committed,
// and dead-lettered again carries the same one.
func (d *delivery) DeadLetter(ctx context.Context, dl consume.DeadLetter) error {
	topic := d.c.cfg.DeadLetterTopic
	if topic == "" {
		topic = d.r.Topic + ".dlq"
	}
	out := &kgo.Record{Topic: topic, Key: d.r.Key, Value: d.r.Value}
	dl.DeadLetterID = DeadLetterID(d.r.Topic, d.r.Partition, d.r.Offset)
	extra := dl.Headers()
	extra[HeaderTopic] = d.r.Topic
	extra[HeaderPartition] = strconv.FormatInt(int64(d.r.Partition), 10)
	extra[HeaderOffset] = strconv.FormatInt(d.r.Offset, 10)
	for _, h := range d.r.Headers {
		if _, replaced := extra[h.Key]; !replaced {
			out.Headers = append(out.Headers, h)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		out.Headers = append(out.Headers, kgo.RecordHeader{Key: k, Value: []byte(extra[k])})
	}
	if err := d.cl.ProduceSync(ctx, out).FirstErr(); err != nil {
		return idem.Retryable(fmt.Errorf("idemkafka: produce dead letter to %q: %w", topic, err))
	}
	return nil
}
