package bench_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The outbox relay's throughput against raw publishing to the same
// JetStream stream, side by side (issue 19):
//
//   - raw: two goroutines publish batches of 100 with PublishMsgAsync and
//     wait for every PubAck, the best a producer can do without a
//     database;
//   - publisher: the same through idemnats.OutboxPublisher (batches of 100
//     outbox.Messages, two goroutines): the publisher's own cost;
//   - relay: the events are first written to the PostgreSQL outbox (not
//     timed), then an outbox.Relay with two workers and batches of 100
//     claims, publishes and marks them sent: the timed part ends when the
//     last event is marked.
//
// Each reports events/s; b.N is the number of events. Run with
//
//	go test -run '^$' -bench OutboxNATS -benchtime 20000x
const (
	outboxBenchBatch   = 100
	outboxBenchWorkers = 2
)

func BenchmarkOutboxNATS(b *testing.B) {
	pgURL := idemtest.ServiceURL(b, "IDEM_POSTGRES_URL")
	natsURL := idemtest.ServiceURL(b, "IDEM_NATS_URL")
	ctx := context.Background()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	s := obSuffix()
	stream, subject := "BENCHOUTBOX_"+s, "benchoutbox."+s
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".>"},
		Storage: jetstream.FileStorage, Duplicates: time.Minute}); err != nil {
		b.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), stream)

	b.Run("raw", func(b *testing.B) {
		run := obSuffix()
		events := obEventsPerSecond(b, func() {
			obParallel(b, b.N, func(from, to int) error {
				futures := make([]jetstream.PubAckFuture, 0, to-from)
				for i := from; i < to; i++ {
					m := nats.NewMsg(subject + ".raw")
					m.Data = []byte(`{"order":42}`)
					m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("raw-%s-%d", run, i))
					f, err := js.PublishMsgAsync(m)
					if err != nil {
						return err
					}
					futures = append(futures, f)
				}
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						return err
					}
				}
				return nil
			})
		})
		b.ReportMetric(events, "events/s")
	})

	b.Run("publisher", func(b *testing.B) {
		pub, err := idemnats.NewOutboxPublisher(js, nil)
		if err != nil {
			b.Fatal(err)
		}
		run := obSuffix()
		events := obEventsPerSecond(b, func() {
			obParallel(b, b.N, func(from, to int) error {
				msgs := make([]outbox.Message, 0, to-from)
				for i := from; i < to; i++ {
					msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("pub-%s-%d", run, i), Topic: subject + ".publisher", Payload: []byte(`{"order":42}`), Attempt: 1})
				}
				for _, err := range pub.Publish(ctx, msgs) {
					if err != nil {
						return err
					}
				}
				return nil
			})
		})
		b.ReportMetric(events, "events/s")
	})

	b.Run("relay", func(b *testing.B) {
		pub, err := idemnats.NewOutboxPublisher(js, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(obRelay(b, pgURL, subject+".relay", []byte(`{"order":42}`), pub), "events/s")
	})
}

// obRelay writes b.N events for topic into a private PostgreSQL outbox
// (not timed), then runs an outbox.Relay with pub, outboxBenchWorkers
// workers and batches of outboxBenchBatch until every event is marked
// sent, and returns the events/s of that part.
func obRelay(b *testing.B, pgURL, topic string, payload []byte, pub outbox.Publisher) float64 {
	b.Helper()
	ctx := context.Background()
	ob, pool := obSchema(b, pgURL)
	run := obSuffix()
	for from := 0; from < b.N; from += outbox.MaxBatch {
		evs := make([]outbox.Event, 0, outbox.MaxBatch)
		for i := from; i < min(from+outbox.MaxBatch, b.N); i++ {
			evs = append(evs, outbox.Event{ID: fmt.Sprintf("relay-%s-%d", run, i), Topic: topic, Payload: payload})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Write(ctx, ob, tx, evs...) }); err != nil {
			b.Fatal(err)
		}
	}
	sent := &obSentCounter{want: int64(b.N), done: make(chan struct{})}
	r, err := outbox.NewRelay(ob, pub, &outbox.Config{Workers: outboxBenchWorkers, BatchSize: outboxBenchBatch,
		PollInterval: 10 * time.Millisecond, PurgeInterval: -1, Hooks: []idem.Hook{sent},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	return obEventsPerSecond(b, func() {
		wg.Go(func() {
			if err := r.Run(rctx); err != nil {
				b.Error(err)
			}
		})
		select {
		case <-sent.done:
		case <-time.After(10 * time.Minute):
			b.Errorf("relay: %d of %d events sent after 10 minutes", sent.n.Load(), b.N)
		}
	})
}

// obEventsPerSecond times f over b.N events.
func obEventsPerSecond(b *testing.B, f func()) float64 {
	b.ResetTimer()
	start := time.Now()
	f()
	d := time.Since(start)
	b.StopTimer()
	return float64(b.N) / d.Seconds()
}

// obParallel runs send over [0, n) in batches of outboxBenchBatch from
// outboxBenchWorkers goroutines.
func obParallel(b *testing.B, n int, send func(from, to int) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range outboxBenchWorkers {
		wg.Go(func() {
			for {
				from := int(next.Add(outboxBenchBatch)) - outboxBenchBatch
				if from >= n {
					return
				}
				if err := send(from, min(from+outboxBenchBatch, n)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// obSentCounter is a relay hook that closes done when want events are sent.
type obSentCounter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (c *obSentCounter) OnPublishEnd(_ context.Context, r outbox.Result) {
	if r.Outcome == idem.Processed && c.n.Add(1) == c.want {
		close(c.done)
	}
}

// outboxSchema migrates a private schema (dropped at cleanup) and returns
// its outbox and a pool whose search path is that schema.
func obSchema(b *testing.B, pgURL string) (*idempgx.Outbox, *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	schema := "bench_outbox_" + obSuffix()
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	})
	m, err := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		b.Fatal(err)
	}
	st, err := idempgx.New(pool, &idempgx.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	return st.Outbox(), pool
}

func obSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
