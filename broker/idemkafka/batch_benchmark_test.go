package idemkafka_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkPostgresEffects consumes records from kfake into a PostgreSQL
// effect through idem: one ProcessBatch per partition fetch versus one
// Process transaction per record, side by side. records/s is the figure to
// compare.
func BenchmarkPostgresEffects(b *testing.B) {
	url := idemtest.ServiceURL(b, "IDEM_POSTGRES_URL")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	schema := "idemkafka_bench_" + suffix()
	if _, err := (mustMigrator(b, pool, schema)).Up(ctx); err != nil {
		b.Fatal(err)
	}
	defer pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+effects+" (key text NOT NULL, value bytea NOT NULL)"); err != nil {
		b.Fatal(err)
	}
	st, err := idempgx.New(pool, &idempgx.Config{Schema: schema, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	insert := "INSERT INTO " + effects + " (key, value) VALUES ($1, $2)"
	batch := func(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
		recs := records(ds)
		return st.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
			var pb pgx.Batch
			for _, i := range fresh {
				pb.Queue(insert, msgs[i].Key, recs[i].Value)
			}
			return tx.SendBatch(ctx, &pb).Close()
		})
	}
	perRecord := func(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
		recs := records(ds)
		out := make([]idem.Outcome, len(msgs))
		for i := range msgs {
			r, err := st.Process(ctx, msgs[i], func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insert, msgs[i].Key, recs[i].Value)
				return err
			})
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	const n = 2000
	for _, bc := range []struct {
		name string
		fn   consume.BatchProcessFunc
	}{{"batch", batch}, {"per-record", perRecord}} {
		b.Run(bc.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				topic := "bench-" + suffix()
				cluster, err := kfake.NewCluster(kfake.SeedTopics(1, topic))
				if err != nil {
					b.Fatal(err)
				}
				prod, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
				var recs []*kgo.Record
				for j := range n {
					recs = append(recs, idemkafka.NewRecord(topic, fmt.Appendf(nil, `{"j":%d}`, j), topic+"-"+strconv.Itoa(j)))
				}
				if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					b.Fatal(err)
				}
				prod.Close()
				var counters consume.Counters
				c, err := idemkafka.NewConsumer(&idemkafka.Config{Config: consume.Config{Name: "bench", Hooks: []idem.Hook{&counters}, Logger: quiet}, Topics: []string{topic}, BatchProcess: bc.fn,
					ClientOpts: []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, TopicRetention: -1, MaxPollRecords: 500})
				if err != nil {
					b.Fatal(err)
				}
				runCtx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				b.StartTimer()
				start := time.Now()
				go func() { c.Run(runCtx); close(done) }()
				for counters.Snapshot().Processed < n {
					time.Sleep(time.Millisecond)
				}
				total += time.Since(start)
				b.StopTimer()
				cancel()
				<-done
				cluster.Close()
			}
			b.ReportMetric(float64(n*b.N)/total.Seconds(), "records/s")
		})
	}
}

func mustMigrator(b *testing.B, pool *pgxpool.Pool, schema string) *idempgx.Migrator {
	m, err := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	return m
}
