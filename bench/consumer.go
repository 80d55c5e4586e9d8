package bench

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/idem-go/idem"
)

// The consumer group compares, on the same in-process handler, no dedupe
// at all (the ceiling), Watermill's Deduplicator middleware with its
// in-memory repository (the peer) and idem's durable SQLite path.

// effectCounter is the handler's effect: it counts applications, so that
// the check can see duplicates that got through.
type effectCounter struct {
	n        atomic.Int64
	expected int64
}

func (c *effectCounter) check(_ context.Context, s Stream) error {
	c.expected += int64(s.Distinct)
	if got := c.n.Load(); got != c.expected {
		return fmt.Errorf("handler applied %d times, want %d: not exactly once", got, c.expected)
	}
	return nil
}

func consumerScenarios(perMessage, batched int) []*Scenario {
	var out []*Scenario
	for _, d := range []int{0, 30} {
		row := func(name string, role Role, n int, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) {
			out = append(out, &Scenario{Group: GroupConsumer, Name: name, Role: role, Concurrency: 8, DupPercent: d,
				Messages: n, Note: note, Prepare: prep})
		}
		row("bare handler, no dedupe", RoleCeiling, batched, "duplicates run twice", prepBareConsumer)
		row("Watermill Deduplicator (map repository)", RolePeer, batched, "in memory: NOT durable; marks before running", prepWatermill)
		row("idem Process (SQLite)", RoleIdem, perMessage, "durable: concurrent calls share one fsync'd commit", prepConsumerProcess)
		row("idem ProcessBatch ×100 (SQLite)", RoleIdem, batched, "durable", prepConsumerBatch)
	}
	return out
}

func watermillMessages(st Stream) []*message.Message {
	msgs := make([]*message.Message, len(st.Keys))
	for i, k := range st.Keys {
		m := message.NewMessage(fmt.Sprintf("delivery-%d", i), []byte(`{"amount":1}`))
		m.Metadata.Set("key", k)
		msgs[i] = m
	}
	return msgs
}

func prepBareConsumer(_ context.Context, _ *Env, s *Scenario) (Run, error) {
	var n atomic.Int64
	h := func(*message.Message) ([]*message.Message, error) { n.Add(1); return nil, nil }
	var msgs []*message.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = watermillMessages(st); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(msgs), func(_ context.Context, _, i int) error {
				_, err := h(msgs[i])
				return err
			})
		},
	}, nil
}

func prepWatermill(_ context.Context, env *Env, s *Scenario) (Run, error) {
	repo, err := middleware.NewMapExpiringKeyRepository(time.Hour)
	if err != nil {
		return Run{}, err
	}
	c := &effectCounter{}
	d := &middleware.Deduplicator{KeyFactory: middleware.NewMessageHasherFromMetadataField("key"), Repository: repo, Timeout: time.Second}
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { c.n.Add(1); return nil, nil })
	var msgs []*message.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = watermillMessages(st); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(msgs), func(_ context.Context, _, i int) error {
				_, err := h(msgs[i])
				return err
			})
		},
		After: c.check,
	}, nil
}

func prepConsumerProcess(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	c := &effectCounter{}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("consumer-process"); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(msgs), func(ctx context.Context, _, i int) error {
				_, err := e.store.Process(ctx, msgs[i], func(context.Context, *sql.Tx) error { c.n.Add(1); return nil })
				return err
			})
		},
		After: c.check,
	}, nil
}

func prepConsumerBatch(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return Run{}, err
	}
	c := &effectCounter{}
	var msgs []idem.Message
	return Run{
		Before: func(_ context.Context, st Stream) error { msgs = st.Messages("consumer-batch"); return nil },
		Exec: func(ctx context.Context, st Stream) error {
			return eachBatch(ctx, s.Concurrency, len(msgs), BatchSize, func(ctx context.Context, _, lo, hi int) error {
				_, err := e.store.ProcessBatch(ctx, msgs[lo:hi], func(_ context.Context, _ *sql.Tx, fresh []int) error {
					c.n.Add(int64(len(fresh)))
					return nil
				})
				return err
			})
		},
		After: c.check,
	}, nil
}
