package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest/faultnet"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/rueidis"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// env is one scenario's private world in the run process: direct
// connections for set-up, publishing and checking, the relays the workers
// go through, and the dead letters seen so far.
type env struct {
	sc  *scenario
	cfg *runConfig
	// base is the spec every worker gets (its Worker field set per worker).
	base   spec
	relays map[string]*faultnet.Relay
	dir    string

	pg     *pgxpool.Pool
	sqlite *idemsqlite.Store
	amqp   *amqp.Connection
	nc     *nats.Conn
	js     jetstream.JetStream
	kafka  *kfake.Cluster
	kcl    *kgo.Client
	redis  rueidis.Client

	mu   sync.Mutex
	dead []deadLetter
	// brokerDeduped counts duplicate publishes the broker itself dropped
	// (JetStream's duplicate window).
	brokerDeduped int

	// private is the scenario's private server, if any (scenario.restart).
	private *private

	closers []func()
}

// serverURL returns the URL of the named server: a private one's when the
// scenario restarts it, else the shared server's from envVar.
func (e *env) serverURL(ctx context.Context, name, envVar, scheme, path string) (string, error) {
	if e.sc.restart != name {
		return need(name, envVar)
	}
	p, err := startPrivate(ctx, name, e.dir)
	if err != nil {
		return "", err
	}
	e.private = p
	e.onClose(p.stop)
	return scheme + "://" + p.addr() + path, nil
}

// deadLetter is one dead-letter record as a DLQ consumer sees it.
type deadLetter struct {
	id, kind string
	reason   idem.DeadReason
	// dlid is the dead letter's own id (consume.HeaderDeadLetterID): the
	// same delivery dead-lettered again after a re-read has the same one.
	dlid string
}

// addDead records a dead letter read from a dead-letter queue; header
// returns one of its headers.
func (e *env) addDead(b []byte, header func(string) string) {
	id, kind := parseBody(b)
	e.mu.Lock()
	e.dead = append(e.dead, deadLetter{id: id, kind: kind,
		reason: idem.DeadReason(header(consume.HeaderReason)), dlid: header(consume.HeaderDeadLetterID)})
	e.mu.Unlock()
}

func (e *env) onClose(f func()) { e.closers = append(e.closers, f) }

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// relayed returns rawURL with its host:port replaced by a new relay's when
// the scenario injects network faults, and rawURL itself otherwise.
func (e *env) relayed(name, rawURL string) (string, error) {
	if !e.cfg.faults || e.sc.calm {
		return rawURL, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("%s URL: %w", name, err)
	}
	r, err := faultnet.Start(u.Host)
	if err != nil {
		return "", err
	}
	e.relays[name] = r
	e.onClose(func() { r.Close() })
	u.Host = r.Addr()
	return u.String(), nil
}

// quiet drops the set-up's informational logs.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// errMissing is a server whose URL is not set: a skip locally, a failure
// under CI=true.
var errMissing = errors.New("server URL not set")

func need(name, envVar string) (string, error) {
	v := os.Getenv(envVar)
	if v == "" {
		return "", fmt.Errorf("%w: %s (%s)", errMissing, envVar, name)
	}
	return v, nil
}

// setupPostgres makes the private schema with idem's migrations and the
// effects table (no uniqueness constraint: a duplicate is a second row).
func (e *env) setupPostgres(ctx context.Context) error {
	raw, err := need("PostgreSQL", "IDEM_POSTGRES_URL")
	if err != nil {
		return err
	}
	pool, err := pgPool(ctx, raw, "public")
	if err != nil {
		return err
	}
	e.pg = pool
	schema := pgx.Identifier{e.base.schema()}.Sanitize()
	e.onClose(func() {
		if !e.cfg.keep {
			dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = pool.Exec(dctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		}
		pool.Close()
	})
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return fmt.Errorf("PostgreSQL: %w", err)
	}
	m, err := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: e.base.schema()})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE `+schema+`.effects (msg_id text NOT NULL, dkey text, worker int NOT NULL,
			at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE INDEX ON `+schema+`.effects (dkey);
		CREATE TABLE `+schema+`.calls (msg_id text NOT NULL, dkey text, worker int NOT NULL,
			at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return err
	}
	e.base.Downstream = raw
	e.base.Postgres, err = e.relayed("postgres", raw)
	return err
}

func (e *env) pgCounts(ctx context.Context, table string) (map[string]int, error) {
	rows, err := e.pg.Query(ctx, `SELECT msg_id, count(*) FROM `+pgx.Identifier{e.base.schema(), table}.Sanitize()+` GROUP BY msg_id`)
	if err != nil {
		return nil, err
	}
	return collectCounts(rows)
}

type scanner interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}

// sqlRows is a *sql.Rows as a scanner.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

func collectCounts(rows scanner) (map[string]int, error) {
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		m[id] = n
	}
	return m, rows.Err()
}

func (e *env) setupSQLite(ctx context.Context) error {
	e.base.SQLite = filepath.Join(e.dir, "idem.db")
	st, err := idemsqlite.Open(ctx, "sqlite://"+e.base.SQLite, &idemsqlite.Config{AutoMigrate: true, Logger: quiet})
	if err != nil {
		return err
	}
	e.sqlite = st
	e.onClose(func() { st.Close() })
	_, err = st.DB().ExecContext(ctx, `CREATE TABLE effects (msg_id TEXT NOT NULL, worker INTEGER NOT NULL)`)
	return err
}

func (e *env) sqliteCounts(ctx context.Context) (map[string]int, error) {
	rows, err := e.sqlite.DB().QueryContext(ctx, `SELECT msg_id, count(*) FROM effects GROUP BY msg_id`)
	if err != nil {
		return nil, err
	}
	return collectCounts(sqlRows{rows})
}

func (e *env) topology() idemamqp.Topology {
	return idemamqp.Topology{Queue: e.base.queue()}.WithDefaults()
}

// setupAMQP declares the run's queues and reads its dead-letter queue.
func (e *env) setupAMQP(ctx context.Context) error {
	raw, err := need("RabbitMQ", "IDEM_AMQP_URL")
	if err != nil {
		return err
	}
	conn, err := amqp.Dial(raw)
	if err != nil {
		return fmt.Errorf("RabbitMQ: %w", err)
	}
	e.amqp = conn
	e.onClose(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	t := e.topology()
	if err := idemamqp.Declare(ch, t); err != nil {
		return err
	}
	e.onClose(func() {
		if ch, err := conn.Channel(); err == nil {
			_ = idemamqp.Delete(ch, t)
			ch.Close()
		}
	})
	dlq, err := ch.Consume(t.DeadLetterQueue, "chaos-dlq", true, false, false, false, nil)
	if err != nil {
		return err
	}
	go func() {
		for d := range dlq {
			e.addDead(d.Body, func(name string) string { v, _ := d.Headers[name].(string); return v })
		}
	}()
	e.base.AMQP, err = e.relayed("amqp", raw)
	return err
}

func (e *env) publishAMQP(ctx context.Context, msgs []publish) error {
	ch, err := e.amqp.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	return e.paced(ctx, msgs, func(m publish) (func() error, error) {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", e.base.queue(), false, false, amqp.Publishing{
			MessageId: m.id, DeliveryMode: amqp.Persistent, Body: body(m.id, m.kind),
		})
		if err != nil {
			return nil, err
		}
		return func() error {
			ok, err := dc.WaitContext(ctx)
			if err == nil && !ok {
				err = errors.New("RabbitMQ nacked a publish")
			}
			return err
		}, nil
	})
}

// setupNATS creates the run's stream, its dead-letter stream and the
// durable consumer the workers share, and reads the dead letters.
func (e *env) setupNATS(ctx context.Context) error {
	raw, err := e.serverURL(ctx, "nats", "IDEM_NATS_URL", "nats", "")
	if err != nil {
		return err
	}
	nc, err := nats.Connect(raw, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("NATS: %w", err)
	}
	e.nc = nc
	e.onClose(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	e.js = js
	s := e.base
	e.onClose(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(dctx, s.stream())
		_ = js.DeleteStream(dctx, s.deadStream())
	})
	// A short duplicate window: most duplicate publishes reach the
	// consumers, which is what the run is for.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.stream(), Subjects: []string{s.subject()},
		Duplicates: 100 * time.Millisecond, Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("NATS: create stream: %w", err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.deadStream(), Subjects: []string{s.deadSubject()},
		Storage: jetstream.FileStorage}); err != nil {
		return fmt.Errorf("NATS: create stream: %w", err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, s.stream(), jetstream.ConsumerConfig{
		Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, AckWait: s.AckWait, MaxDeliver: -1,
		MaxAckPending: 1000,
	}); err != nil {
		return fmt.Errorf("NATS: create consumer: %w", err)
	}
	oc, err := js.OrderedConsumer(ctx, s.deadStream(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		e.addDead(m.Data(), m.Headers().Get)
	})
	if err != nil {
		return err
	}
	e.onClose(cc.Stop)
	e.base.NATS, err = e.relayed("nats", raw)
	return err
}

func (e *env) publishNATS(ctx context.Context, msgs []publish) error {
	return e.paced(ctx, msgs, func(m publish) (func() error, error) {
		f, err := e.js.PublishAsync(e.base.subject(), body(m.id, m.kind), jetstream.WithMsgID(m.id))
		if err != nil {
			return nil, err
		}
		return func() error {
			select {
			case ack := <-f.Ok():
				if ack.Duplicate {
					e.mu.Lock()
					e.brokerDeduped++
					e.mu.Unlock()
				}
				return nil
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}, nil
	})
}

// relayListener is kfake's listener, advertising the relay's address so
// that every Kafka connection (metadata names the brokers) goes through the
// relay.
type relayListener struct {
	net.Listener
	addr net.Addr
}

func (l relayListener) Addr() net.Addr { return l.addr }

// setupKafka starts a kfake cluster in this process, served over TCP
// (through a relay when faults are on), with the run's topic and its
// dead-letter topic, and reads the dead letters.
func (e *env) setupKafka(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(8, e.base.topic()), kfake.SeedTopics(1, e.base.deadTopic()),
		kfake.GroupMinSessionTimeout(time.Second)}
	addr := ln.Addr().String()
	if e.cfg.faults {
		r, err := faultnet.Start(addr)
		if err != nil {
			ln.Close()
			return err
		}
		e.relays["kafka"] = r
		e.onClose(func() { r.Close() })
		tcp, _ := net.ResolveTCPAddr("tcp", r.Addr())
		addr = r.Addr()
		opts = append(opts, kfake.ListenFn(func(string, string) (net.Listener, error) {
			return relayListener{ln, tcp}, nil
		}))
	} else {
		opts = append(opts, kfake.ListenFn(func(string, string) (net.Listener, error) { return ln, nil }))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		ln.Close()
		return err
	}
	e.kafka = c
	e.onClose(c.Close)
	e.base.Kafka = addr
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(e.base.deadTopic()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	e.kcl = cl
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.onClose(func() { cancel(); <-done; cl.Close() })
	go func() {
		defer close(done)
		for rctx.Err() == nil {
			cl.PollFetches(rctx).EachRecord(func(r *kgo.Record) {
				e.addDead(r.Value, func(name string) string {
					for _, h := range r.Headers {
						if h.Key == name {
							return string(h.Value)
						}
					}
					return ""
				})
			})
		}
	}()
	return nil
}

func (e *env) publishKafka(ctx context.Context, msgs []publish) error {
	return e.paced(ctx, msgs, func(m publish) (func() error, error) {
		done := make(chan error, 1)
		e.kcl.Produce(ctx, idemkafka.NewRecord(e.base.topic(), body(m.id, m.kind), m.id),
			func(_ *kgo.Record, err error) { done <- err })
		return func() error { return <-done }, nil
	})
}

// publishInbox receives the messages into the PostgreSQL inbox (a
// duplicate is dropped there: the receive side's dedupe).
func (e *env) publishInbox(ctx context.Context, msgs []publish) error {
	st, err := idempgx.New(e.pg, &idempgx.Config{Schema: e.base.schema()})
	if err != nil {
		return err
	}
	ib := st.Inbox()
	return e.paced(ctx, msgs, func(m publish) (func() error, error) {
		fresh, err := ib.Receive(ctx, inboxdriver.Message{Source: "chaos", ID: m.id, Type: inboxType, Payload: body(m.id, m.kind)})
		if err == nil && !fresh {
			e.mu.Lock()
			e.brokerDeduped++
			e.mu.Unlock()
		}
		return nil, err
	})
}

func (e *env) inboxDead(ctx context.Context) error {
	rows, err := e.pg.Query(ctx, `SELECT payload, coalesce(dead_reason, '') FROM `+
		pgx.Identifier{e.base.schema(), "idem_inbox"}.Sanitize()+` WHERE state = 'dead'`)
	if err != nil {
		return err
	}
	defer rows.Close()
	var dead []deadLetter
	for rows.Next() {
		var b []byte
		var r string
		if err := rows.Scan(&b, &r); err != nil {
			return err
		}
		id, kind := parseBody(b)
		// A row is its own dead letter.
		dead = append(dead, deadLetter{id: id, kind: kind, reason: idem.DeadReason(r), dlid: id})
	}
	if err := rows.Err(); err != nil {
		return err
	}
	e.mu.Lock()
	e.dead = dead
	e.mu.Unlock()
	return nil
}

// setupRedis connects to Redis (the workers through a relay when faults are
// on) and removes the run's keys at the end.
func (e *env) setupRedis(ctx context.Context) error {
	raw, err := e.serverURL(ctx, "redis", "IDEM_REDIS_URL", "redis", "/0")
	if err != nil {
		return err
	}
	opt, err := rueidis.ParseURL(raw)
	if err != nil {
		return err
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return fmt.Errorf("connect to Redis: %w", err)
	}
	e.redis = c
	prefix := e.base.redisPrefix()
	e.onClose(func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var cursor uint64
		for {
			se, err := c.Do(dctx, c.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
			if err != nil {
				break
			}
			if len(se.Elements) > 0 {
				c.Do(dctx, c.B().Del().Key(se.Elements...).Build())
			}
			if cursor = se.Cursor; cursor == 0 {
				break
			}
		}
		c.Close()
	})
	e.base.Redis, err = e.relayed("redis", raw)
	return err
}

// paced publishes msgs in order at cfg.rate messages a second (0: as fast
// as the broker takes them). send publishes one message and returns how to
// wait for the broker's answer (nil: nothing to wait for); at most 256
// answers are awaited at once.
func (e *env) paced(ctx context.Context, msgs []publish, send func(publish) (wait func() error, err error)) error {
	var pending []func() error
	flush := func() error {
		for _, wait := range pending {
			if err := wait(); err != nil {
				return err
			}
		}
		pending = pending[:0]
		return nil
	}
	start := time.Now()
	for i, m := range msgs {
		wait, err := send(m)
		if err != nil {
			return fmt.Errorf("publish %s: %w", m.id, err)
		}
		if wait != nil {
			pending = append(pending, wait)
		}
		if len(pending) >= 256 {
			if err := flush(); err != nil {
				return err
			}
		}
		if e.cfg.rate > 0 && i%50 == 49 {
			if err := flush(); err != nil {
				return err
			}
			want := time.Duration(float64(i+1) / e.cfg.rate * float64(time.Second))
			if d := want - time.Since(start); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
	}
	return flush()
}

func itoa(i int) string { return strconv.Itoa(i) }
