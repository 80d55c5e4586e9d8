package bench_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The cost of outbox.Write inside a transaction against a plain INSERT of
// the same row into a table of the same columns (a primary key and no other
// index), on PostgreSQL and SQLite (issue 19). Each op is two
// transactions, one of each kind, in alternating order, so both see the
// same machine (commit latency dominates and varies on a shared host); the
// metrics are each kind's mean per transaction and their ratio:
//
//	go test -run '^$' -bench 'OutboxWrite' -benchtime 3000x
//
// "outbox" validates the events and inserts them with the driver's single
// statement (unnest on PostgreSQL, a multi-row VALUES on SQLite) into
// idem_outbox, whose partial indexes keep the relay's claims cheap;
// "plain" is the textbook one INSERT per event a hand-written outbox does.
// x10 writes 10 events per transaction.
func BenchmarkOutboxWrite(b *testing.B) {
	ctx := context.Background()
	payload := []byte(`{"order":42,"total_cents":1999,"currency":"EUR"}`)
	headers := map[string]string{"content-type": "application/json"}
	events := func(run string, i, n int) []outbox.Event {
		evs := make([]outbox.Event, n)
		for j := range evs {
			evs[j] = outbox.Event{Topic: "orders.created", Key: fmt.Sprint("order-", i%64), ID: fmt.Sprintf("%s-%d-%d", run, i, j),
				Payload: payload, Headers: headers}
		}
		return evs
	}
	// sideBySide times write (the outbox) and plain alternately.
	sideBySide := func(b *testing.B, n int, write, plain func(evs []outbox.Event) error) {
		run := obSuffix()
		var tOutbox, tPlain time.Duration
		timed := func(d *time.Duration, f func(evs []outbox.Event) error, evs []outbox.Event) {
			start := time.Now()
			if err := f(evs); err != nil {
				b.Fatal(err)
			}
			*d += time.Since(start)
		}
		b.ResetTimer()
		for i := range b.N {
			evs := events(run, i, n)
			if i%2 == 0 {
				timed(&tOutbox, write, evs)
				timed(&tPlain, plain, evs)
			} else {
				timed(&tPlain, plain, evs)
				timed(&tOutbox, write, evs)
			}
		}
		b.ReportMetric(float64(tOutbox.Nanoseconds())/float64(b.N), "outbox-ns/tx")
		b.ReportMetric(float64(tPlain.Nanoseconds())/float64(b.N), "plain-ns/tx")
		b.ReportMetric(float64(tOutbox)/float64(tPlain), "outbox/plain")
	}

	b.Run("postgres", func(b *testing.B) {
		pgURL := idemtest.ServiceURL(b, "IDEM_POSTGRES_URL")
		ob, pool := obSchema(b, pgURL)
		if _, err := pool.Exec(ctx, `CREATE TABLE plain_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	event_id text NOT NULL, topic text NOT NULL, event_key text NOT NULL, payload bytea NOT NULL, headers text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			b.Fatal(err)
		}
		write := func(evs []outbox.Event) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Write(ctx, tx, evs...) })
		}
		plain := func(evs []outbox.Event) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				for _, ev := range evs {
					if _, err := tx.Exec(ctx, `INSERT INTO plain_events (event_id, topic, event_key, payload, headers) VALUES ($1, $2, $3, $4, $5)`,
						ev.ID, ev.Topic, ev.Key, ev.Payload, `{"content-type":"application/json"}`); err != nil {
						return err
					}
				}
				return nil
			})
		}
		for _, n := range []int{1, 10} {
			b.Run(fmt.Sprintf("x%d", n), func(b *testing.B) { sideBySide(b, n, write, plain) })
		}
	})

	b.Run("sqlite", func(b *testing.B) {
		s, err := idemsqlite.Open(ctx, "sqlite://"+filepath.Join(b.TempDir(), "bench.db"),
			&idemsqlite.Config{AutoMigrate: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if _, err := s.DB().ExecContext(ctx, `CREATE TABLE plain_events (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL,
	topic TEXT NOT NULL, event_key TEXT NOT NULL, payload BLOB NOT NULL, headers TEXT NOT NULL, created_at INTEGER NOT NULL)`); err != nil {
			b.Fatal(err)
		}
		inTx := func(fn func(tx *sql.Tx) error) error {
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
		ob := s.Outbox()
		write := func(evs []outbox.Event) error {
			return inTx(func(tx *sql.Tx) error { return ob.Write(ctx, tx, evs...) })
		}
		plain := func(evs []outbox.Event) error {
			return inTx(func(tx *sql.Tx) error {
				for _, ev := range evs {
					if _, err := tx.ExecContext(ctx, `INSERT INTO plain_events (event_id, topic, event_key, payload, headers, created_at)
VALUES (?, ?, ?, ?, ?, ?)`, ev.ID, ev.Topic, ev.Key, ev.Payload, `{"content-type":"application/json"}`, time.Now().UnixMicro()); err != nil {
						return err
					}
				}
				return nil
			})
		}
		for _, n := range []int{1, 10} {
			b.Run(fmt.Sprintf("x%d", n), func(b *testing.B) { sideBySide(b, n, write, plain) })
		}
	})
}

// The outbox relay's throughput against raw publishing to the same
// RabbitMQ queue with publisher confirms, batches of 100 (issue 19):
//
//   - raw: one confirm channel; batches of 100 published back to back,
//     then every confirm awaited: the best a producer does without a
//     database;
//   - publisher: the same through idemamqp.OutboxPublisher (the
//     publisher's own cost, mandatory and returns included);
//   - relay: the events are first written to the PostgreSQL outbox (not
//     timed), then an outbox.Relay (2 workers, batches of 100, one
//     OutboxPublisher) claims, publishes and marks them sent; the timed
//     part ends when the last one is marked.
//
// Each reports events/s; b.N is the number of events:
//
//	go test -run '^$' -bench OutboxAMQP -benchtime 20000x
func BenchmarkOutboxAMQP(b *testing.B) {
	pgURL := idemtest.ServiceURL(b, "IDEM_POSTGRES_URL")
	amqpURL := idemtest.ServiceURL(b, "IDEM_AMQP_URL")
	ctx := context.Background()
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	admin, err := conn.Channel()
	if err != nil {
		b.Fatal(err)
	}
	queue := "bench.outbox." + obSuffix()
	if _, err := admin.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		b.Fatal(err)
	}
	defer func() { _, _ = admin.QueueDelete(queue, false, false, false) }()
	purge := func() {
		if _, err := admin.QueuePurge(queue, false); err != nil {
			b.Fatal(err)
		}
	}
	payload := []byte(`{"order":42}`)

	b.Run("raw", func(b *testing.B) {
		defer purge()
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		defer ch.Close()
		if err := ch.Confirm(false); err != nil {
			b.Fatal(err)
		}
		run := obSuffix()
		events := obEventsPerSecond(b, func() {
			for from := 0; from < b.N; from += outboxBenchBatch {
				dcs := make([]*amqp.DeferredConfirmation, 0, outboxBenchBatch)
				for i := from; i < min(from+outboxBenchBatch, b.N); i++ {
					dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
						MessageId: fmt.Sprintf("raw-%s-%d", run, i), Body: payload, DeliveryMode: amqp.Persistent})
					if err != nil {
						b.Fatal(err)
					}
					dcs = append(dcs, dc)
				}
				for _, dc := range dcs {
					if ok, err := dc.WaitContext(ctx); err != nil || !ok {
						b.Fatalf("confirm: %v, %v", ok, err)
					}
				}
			}
		})
		b.ReportMetric(events, "events/s")
	})

	b.Run("publisher", func(b *testing.B) {
		defer purge()
		pub, err := idemamqp.NewOutboxPublisher(idemamqp.DialURL(amqpURL), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		run := obSuffix()
		events := obEventsPerSecond(b, func() {
			for from := 0; from < b.N; from += outboxBenchBatch {
				msgs := make([]outbox.Message, 0, outboxBenchBatch)
				for i := from; i < min(from+outboxBenchBatch, b.N); i++ {
					msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("pub-%s-%d", run, i), Topic: queue, Payload: payload, Attempt: 1})
				}
				for _, err := range pub.Publish(ctx, msgs) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		b.ReportMetric(events, "events/s")
	})

	b.Run("relay", func(b *testing.B) {
		defer purge()
		pub, err := idemamqp.NewOutboxPublisher(idemamqp.DialURL(amqpURL), nil)
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		events := obRelay(b, pgURL, queue, payload, pub)
		b.ReportMetric(events, "events/s")
	})
}
