package idemkafka

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
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

// ProcessBatchFunc processes the records of one partition fetch
// idempotently, in order: typically a closure over a SQL store's
// ProcessBatch, which inserts every dedupe record in one round trip and
// runs the effects of the fresh ones in the same transaction. msgs[i]
// belongs to recs[i]. It returns one result per message (Processed,
// Duplicate or Mismatched), or an error after which nothing it did may
// have committed, classified by the retry package's rules.
type ProcessBatchFunc func(ctx context.Context, msgs []idem.Message, recs []*kgo.Record) ([]idem.ProcessResult, error)

// MissingID says how a record without an id header is keyed.
type MissingID int

const (
	// OffsetKey keys it by topic-partition-offset. This is weaker than a
	// producer id: it catches redeliveries (rebalances, restarts before
	// the offset commit) but not a producer that wrote the same event
	// twice, which lands at two offsets.
	OffsetKey MissingID = iota
	// ContentKey keys it by the SHA-256 of its value.
	ContentKey
	// DeadLetterMissingID dead-letters it.
	DeadLetterMissingID
)

// Config configures a [Consumer].
type Config struct {
	// Name is the idem consumer name: the dedupe scope and the consumer
	// named in dead letters. Required.
	Name string
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
	// Process handles one partition's fetch idempotently. Required.
	Process ProcessBatchFunc
	// IDHeader names the id header. Default DefaultIDHeader.
	IDHeader string
	// MissingID is the policy for records without an id header.
	MissingID MissingID
	// DeadLetterTopic receives records after max_attempts, a permanent
	// error or an id conflict. Default: the record's topic + ".dlq".
	DeadLetterTopic string
	// Retry is the in-process backoff of failed records (nil: full jitter,
	// base 1s, cap 1m, 5 attempts).
	Retry *retry.Policy
	// Retention is the dedupe window. Default 24h. It must cover the
	// redelivery horizon (see [NewConsumer]).
	Retention time.Duration
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
	// Hooks observe every handled record.
	Hooks consume.Hooks
	// Logger; nil means slog.Default().
	Logger *slog.Logger
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

// Consumer consumes Kafka topics in a consumer group, one Process batch
// per partition fetch, and commits offsets only after the effects commit.
type Consumer struct {
	cfg    Config
	cl     *kgo.Client
	engine *consume.Engine
	policy retry.Policy
	hooks  consume.Hooks

	mu       sync.Mutex
	inflight map[topicPartition]*inflight
	revoked  map[topicPartition]bool
	pending  map[string]map[int32]kgo.EpochOffset
}

// NewConsumer checks cfg, creates the consumer's client and checks the
// dedupe window: it refuses to start (an error wrapping
// idem.ErrInvalidConfig that names both numbers) when the retention is
// shorter than max_attempts × max_backoff or a topic's retention, because
// a record re-read after its dedupe record expired would be processed
// twice.
func NewConsumer(ctx context.Context, cfg *Config) (*Consumer, error) {
	if cfg == nil || cfg.Process == nil || len(cfg.Topics) == 0 {
		return nil, fmt.Errorf("%w: idemkafka: NewConsumer needs a config with Topics and Process", idem.ErrInvalidConfig)
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
	if c.cfg.Logger == nil {
		c.cfg.Logger = slog.Default()
	}
	if c.cfg.Retention == 0 {
		c.cfg.Retention = idem.DefaultRetention
	}
	missing := consume.ContentKey
	if c.cfg.MissingID == DeadLetterMissingID {
		missing = consume.DeadLetterMissingID
	}
	engine, err := consume.New(c.processOne, &consume.Config{
		Name: c.cfg.Name, Retry: c.cfg.Retry, Retention: c.cfg.Retention, MissingID: missing,
		Hooks: c.cfg.Hooks, Logger: c.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	c.engine, c.policy, c.hooks = engine, engine.Policy(), engine.Config().Hooks
	opts := append([]kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, c.cfg.ClientOpts...)
	opts = append(opts,
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(c.onAssigned),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemkafka: client: %w", err)
	}
	windows, err := c.retentionWindows(ctx, cl)
	if err == nil {
		err = consume.CheckRetention(c.cfg.Retention, c.policy.MaxAttempts, c.policy.Cap, windows...)
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	c.cl = cl
	return c, nil
}

// Engine returns the engine that handles records one at a time (retries
// and dead letters).
func (c *Consumer) Engine() *consume.Engine { return c.engine }

// Client returns the consumer's franz-go client.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Run consumes until ctx ends, then commits what committed, leaves the
// group and closes the client; a Consumer runs once. It returns nil when
// ctx ends, or a fatal fetch error.
func (c *Consumer) Run(ctx context.Context) error {
	defer c.cl.Close() // leaves the group
	for {
		fetches := c.cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			// Commit what committed before leaving, on a context of its
			// own: ctx has ended.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			c.commit(cctx, c.takePending(nil))
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			c.cfg.Logger.Warn("idem: kafka fetch error", "consumer", c.cfg.Name, "topic", topic, "partition", p, "err", err)
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				c.partition(ctx, topicPartition{p.Topic, p.Partition}, p.Records)
			}
		})
		if ctx.Err() == nil {
			c.commit(ctx, c.takePending(nil))
		}
	}
}

// partition processes one partition's records unless it was revoked, and
// records the offset after the highest contiguous settled record.
func (c *Consumer) partition(ctx context.Context, tp topicPartition, recs []*kgo.Record) {
	c.mu.Lock()
	if c.revoked[tp] {
		c.mu.Unlock()
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	f := &inflight{cancel: cancel, done: make(chan struct{})}
	c.inflight[tp] = f
	c.mu.Unlock()

	n := c.process(pctx, recs)

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

// process settles recs in order and returns how many, from the first,
// were settled (processed, duplicate or dead-lettered) before ctx ended.
func (c *Consumer) process(ctx context.Context, recs []*kgo.Record) int {
	ds := make([]*delivery, len(recs))
	for i, r := range recs {
		ds[i] = &delivery{c: c, r: r}
	}
	for failures := 0; ; failures++ {
		err := c.batch(ctx, ds)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return 0
		}
		if !idem.IsRetryable(err) && !errors.Is(err, consume.ErrCommitUnknown) {
			// A handler failure: find the failing record one at a time.
			c.cfg.Logger.Info("idem: kafka batch failed; retrying its records one at a time", "consumer", c.cfg.Name, "err", err)
			break
		}
		// An outage of the store: retry the batch, not counted.
		if retry.Sleep(ctx, c.policy.DelayFor(failures, err)) != nil {
			return 0
		}
	}
	for i, d := range ds {
		if d.done {
			continue
		}
		if !c.one(ctx, d) {
			return i
		}
	}
	return len(ds)
}

// batch runs the user's batch over every delivery that can be keyed and
// marks those the batch settled (processed or duplicate). Mismatched and
// unkeyable records are left to the engine, which dead-letters them.
func (c *Consumer) batch(ctx context.Context, ds []*delivery) error {
	var msgs []idem.Message
	var recs []*kgo.Record
	var idx []int
	fp := c.engine.Config().Fingerprint
	for i, d := range ds {
		key, reason := c.engine.Key(d)
		if reason != "" {
			continue
		}
		msgs = append(msgs, idem.Message{Scope: c.cfg.Name, Key: key, Fingerprint: fp(d), Retention: c.cfg.Retention})
		recs = append(recs, d.r)
		idx = append(idx, i)
	}
	if len(msgs) == 0 {
		return nil
	}
	start := time.Now()
	results, err := c.call(ctx, msgs, recs)
	if err != nil {
		return err
	}
	for j, res := range results {
		d := ds[idx[j]]
		out := consume.OutcomeProcessed
		switch res {
		case idem.Processed:
		case idem.Duplicate:
			out = consume.OutcomeDuplicate
		default:
			continue
		}
		d.done = true
		c.hooks.OnDelivery(ctx, consume.Event{Consumer: c.cfg.Name, ID: d.ID(), Key: msgs[j].Key, Attempt: 1, Outcome: out, Duration: time.Since(start)})
	}
	return nil
}

// call runs the user's batch function, turning a panic into an error and
// checking that it returned one result per message.
func (c *Consumer) call(ctx context.Context, msgs []idem.Message, recs []*kgo.Record) (results []idem.ProcessResult, err error) {
	defer func() {
		if p := recover(); p != nil {
			c.cfg.Logger.Error("idem: kafka batch handler panicked", "consumer", c.cfg.Name, "panic", p, "stack", string(debug.Stack()))
			results, err = nil, fmt.Errorf("idemkafka: handler panicked: %v", p)
		}
	}()
	results, err = c.cfg.Process(ctx, msgs, recs)
	if err == nil && len(results) != len(msgs) {
		return nil, fmt.Errorf("idemkafka: ProcessBatchFunc returned %d results for %d messages", len(results), len(msgs))
	}
	return results, err
}

// processOne is the engine's ProcessFunc: a batch of one.
func (c *Consumer) processOne(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.ProcessResult, error) {
	results, err := c.call(ctx, []idem.Message{msg}, []*kgo.Record{d.(*delivery).r})
	if err != nil {
		return "", err
	}
	return results[0], nil
}

// one runs the engine on d until it is settled, sleeping between
// attempts in process; false when ctx ended first.
func (c *Consumer) one(ctx context.Context, d *delivery) bool {
	for failures := 0; ; {
		d.retryAfter = -1
		out, err := c.engine.Handle(ctx, d)
		switch {
		case d.done:
			return true
		case ctx.Err() != nil || out == consume.OutcomeAbandoned:
			return false
		case err != nil:
			// Producing the dead letter failed: try again later.
			if retry.Sleep(ctx, c.policy.Delay(failures)) != nil {
				return false
			}
			failures++
		case d.retryAfter >= 0:
			if retry.Sleep(ctx, d.retryAfter) != nil {
				return false
			}
		}
	}
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
func (c *Consumer) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) {
	if len(offsets) == 0 {
		return
	}
	c.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
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
func (c *Consumer) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.stop(revoked)
	c.commit(ctx, c.takePending(revoked))
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

// delivery adapts a *kgo.Record to consume.Delivery for the engine's
// one-at-a-time path, retrying in process.
type delivery struct {
	c          *Consumer
	r          *kgo.Record
	st         consume.State
	done       bool
	retryAfter time.Duration
}

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
	if d.c.cfg.MissingID == OffsetKey {
		return offsetKey(d.r.Topic, d.r.Partition, d.r.Offset)
	}
	return ""
}

// offsetKey is "topic-partition-offset", hashed when it would exceed the
// key limit (topic names go up to 249 bytes).
func offsetKey(topic string, partition int32, offset int64) string {
	k := topic + "-" + strconv.FormatInt(int64(partition), 10) + "-" + strconv.FormatInt(offset, 10)
	if len(k) > idem.MaxKeyLen {
		sum := sha256.Sum256([]byte(k))
		k = "tpo-" + hex.EncodeToString(sum[:])
	}
	return k
}

func (d *delivery) Body() []byte         { return d.r.Value }
func (d *delivery) Origin() string       { return d.r.Topic }
func (d *delivery) State() consume.State { return d.st }
func (d *delivery) Ack(context.Context) error {
	d.done = true
	return nil
}

func (d *delivery) Retry(_ context.Context, after time.Duration, st consume.State) error {
	d.st, d.retryAfter = st, after
	return nil
}

func (d *delivery) Requeue(context.Context) error {
	d.retryAfter = 0
	return nil
}

// DeadLetter produces a copy of the record with the failure headers and
// the original topic, partition and offset, and waits for the broker.
func (d *delivery) DeadLetter(ctx context.Context, dl consume.DeadLetter) error {
	topic := d.c.cfg.DeadLetterTopic
	if topic == "" {
		topic = d.r.Topic + ".dlq"
	}
	out := &kgo.Record{Topic: topic, Key: d.r.Key, Value: d.r.Value}
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
	if err := d.c.cl.ProduceSync(ctx, out).FirstErr(); err != nil {
		return idem.Retryable(fmt.Errorf("idemkafka: produce dead letter to %q: %w", topic, err))
	}
	d.done = true
	return nil
}
