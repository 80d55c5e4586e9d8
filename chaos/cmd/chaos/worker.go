package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kgo"
)

// runWorker is one consumer process: it consumes until SIGTERM (or until
// the run process SIGKILLs it) and applies each message's effect into the
// effects table, which has no uniqueness constraint, so a duplicated effect
// is a second row.
func runWorker() error {
	s, err := specFromEnv()
	if err != nil {
		return err
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).
		With("worker", s.Worker))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	sc, ok := scenarioByName(s.Scenario)
	if !ok {
		return fmt.Errorf("unknown scenario %q", s.Scenario)
	}
	err = sc.work(ctx, s)
	if ctx.Err() != nil {
		return nil // asked to stop
	}
	return err
}

// pgPool connects to s.Postgres (through the relay, if any) with the
// private schema first on the search path.
func pgPool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return pgxpool.NewWithConfig(ctx, cfg)
}

// pgEffect is the transactional path's handler: the effect row, in the
// transaction that records the message.
func pgEffect(s spec) func(ctx context.Context, tx pgx.Tx, d consume.Delivery) error {
	return func(ctx context.Context, tx pgx.Tx, d consume.Delivery) error {
		id, kind := parseBody(d.Body())
		if err := poison(kind); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, worker) VALUES ($1, $2)`, id, s.Worker)
		return err
	}
}

func pgStore(ctx context.Context, s spec) (*idempgx.Store, func(), error) {
	pool, err := pgPool(ctx, s.Postgres, s.schema())
	if err != nil {
		return nil, nil, err
	}
	st, err := idempgx.New(pool, &idempgx.Config{Schema: s.schema()})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return st, pool.Close, nil
}

func engineConfig(s spec) consume.Config {
	return consume.Config{Name: s.consumerName(), Retry: policy()}
}

// workAMQP consumes the run's RabbitMQ queue with process.
func workAMQP(ctx context.Context, s spec, process consume.ProcessFunc) error {
	c, err := idemamqp.NewConsumer(idemamqp.DialURL(s.AMQP), &idemamqp.Config{
		Config:   engineConfig(s),
		Topology: idemamqp.Topology{Queue: s.queue()},
		Process:  process,
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// workNATS consumes the run's durable JetStream consumer with process.
func workNATS(ctx context.Context, s spec, process consume.ProcessFunc) error {
	nc, err := nats.Connect(s.NATS, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	c, err := idemnats.NewConsumer(js, &idemnats.Config{
		Config:            engineConfig(s),
		Stream:            s.stream(),
		Consumer:          "workers",
		DeadLetterSubject: s.deadSubject(),
		Process:           process,
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// onPostgres runs work with the run's idempgx store.
func onPostgres(work func(ctx context.Context, s spec, st *idempgx.Store) error) func(ctx context.Context, s spec) error {
	return func(ctx context.Context, s spec) error {
		st, done, err := pgStore(ctx, s)
		if err != nil {
			return err
		}
		defer done()
		return work(ctx, s, st)
	}
}

var (
	workAMQPPostgres = onPostgres(func(ctx context.Context, s spec, st *idempgx.Store) error {
		return workAMQP(ctx, s, consume.Transactional(st, pgEffect(s)))
	})
	workNATSPostgres = onPostgres(func(ctx context.Context, s spec, st *idempgx.Store) error {
		return workNATS(ctx, s, consume.Transactional(st, pgEffect(s)))
	})
	workInboxPostgres = onPostgres(workInbox)
)

func workAMQPSQLite(ctx context.Context, s spec) error {
	st, err := idemsqlite.Open(ctx, "sqlite://"+s.SQLite, nil)
	if err != nil {
		return err
	}
	defer st.Close()
	return workAMQP(ctx, s, consume.Transactional(st, func(ctx context.Context, tx *sql.Tx, d consume.Delivery) error {
		id, kind := parseBody(d.Body())
		if err := poison(kind); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (msg_id, worker) VALUES (?, ?)`, id, s.Worker)
		return err
	}))
}

// workKafkaPostgres consumes the run's topic in a group; static gives each
// worker a group instance id.
func workKafkaPostgres(static bool) func(ctx context.Context, s spec) error {
	return onPostgres(func(ctx context.Context, s spec, st *idempgx.Store) error { return workKafka(ctx, s, st, static) })
}

func workKafka(ctx context.Context, s spec, st *idempgx.Store, static bool) error {
	effect := pgEffect(s)
	opts := []kgo.Opt{
		kgo.SeedBrokers(s.Kafka),
		kgo.SessionTimeout(3 * time.Second),
		kgo.HeartbeatInterval(500 * time.Millisecond),
		kgo.RebalanceTimeout(4 * time.Second),
	}
	if static {
		// Static membership: a worker started again after a kill takes
		// its place back without a rebalance.
		opts = append(opts, kgo.InstanceID(fmt.Sprintf("worker-%d", s.Worker)))
	}
	c, err := idemkafka.NewConsumer(&idemkafka.Config{
		Config:          engineConfig(s),
		Topics:          []string{s.topic()},
		ClientOpts:      opts,
		DeadLetterTopic: s.deadTopic(),
		TopicRetention:  time.Hour,
		BatchProcess: consume.TransactionalBatch(st, func(ctx context.Context, tx pgx.Tx, fresh []consume.Delivery) error {
			for _, d := range fresh {
				if err := effect(ctx, tx, d); err != nil {
					return err
				}
			}
			return nil
		}),
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

func workInbox(ctx context.Context, s spec, st *idempgx.Store) error {
	w, err := inbox.NewWorker(st.Inbox(), &inbox.Config{
		Workers:      4,
		BatchSize:    10,
		Lease:        s.Lease,
		PollInterval: 50 * time.Millisecond,
		Retry:        policy(),
	})
	if err != nil {
		return err
	}
	if err := w.Handle(inboxType, func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		id, kind := parseBody(msg.Payload)
		if err := poison(kind); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, worker) VALUES ($1, $2)`, id, s.Worker)
		return err
	}); err != nil {
		return err
	}
	return w.Run(ctx)
}

const inboxType = "chaos.effect"

// workGuardRedis runs the lease path: NATS deliveries, an idem.Guard over
// Redis, and an effect in a "downstream" system (a PostgreSQL table that
// the Guard does not share a transaction with). With downstreamKey the
// downstream deduplicates on Run.DownstreamKey, as a payment API does on
// its Idempotency-Key; without it every call is an effect.
func workGuardRedis(downstreamKey bool) func(ctx context.Context, s spec) error {
	return func(ctx context.Context, s spec) error {
		opt, err := rueidis.ParseURL(s.Redis)
		if err != nil {
			return err
		}
		rc, err := rueidis.NewClient(opt)
		if err != nil {
			return err
		}
		defer rc.Close()
		st, err := idemredis.New(rc, &idemredis.Config{Prefix: s.redisPrefix()})
		if err != nil {
			return err
		}
		// The downstream is the external system: reached directly, not
		// through the relay.
		down, err := pgPool(ctx, s.Downstream, s.schema())
		if err != nil {
			return err
		}
		defer down.Close()
		g := idem.NewGuard(st, &idem.GuardConfig{Lease: s.Lease})
		return workNATS(ctx, s, consume.GuardProcess(g, func(ctx context.Context, run idem.Run, d consume.Delivery) error {
			id, kind := parseBody(d.Body())
			if err := poison(kind); err != nil {
				return err
			}
			key := ""
			if downstreamKey {
				key = run.DownstreamKey("effect")
			}
			if err := downstreamCall(ctx, down, id, key, s.Worker); err != nil {
				return err
			}
			// The external system's answer takes a while to come back: a
			// zombie stopped here has had its effect, and resumes after a
			// takeover that calls again.
			time.Sleep(5 * time.Millisecond)
			return nil
		}))
	}
}

// downstreamCall is the external system: it logs every call, and applies
// the effect once per idempotency key (every time without a key).
func downstreamCall(ctx context.Context, down *pgxpool.Pool, id, key string, worker int) error {
	return pgx.BeginFunc(ctx, down, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO calls (msg_id, dkey, worker) VALUES ($1, $2, $3)`, id, key, worker); err != nil {
			return err
		}
		if key == "" {
			_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, worker) VALUES ($1, $2)`, id, worker)
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, key); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, dkey, worker)
			SELECT $1, $2, $3 WHERE NOT EXISTS (SELECT 1 FROM effects WHERE dkey = $2)`, id, key, worker)
		return err
	})
}
