package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The outbox scenarios (issue 19) check the producer side end to end:
// producer transactions on PostgreSQL write a business row and an outbox
// event, a fifth of them also run a transaction that writes an event and
// rolls back; relay processes publish the outbox to the broker and are
// SIGKILLed and SIGSTOPped past their lease at random; the consumer
// workers apply each event through the transactional path, under the
// suite's usual faults. The check: every committed event took effect
// exactly once (or was dead-lettered by the consumer, for the poison
// ones), and no event of a rolled-back transaction ever did (run.go's
// check counts an effect of an id never published as wrong).
const (
	injectsOutbox   = "producer transactions writing a business row and an outbox event (20% more that roll back), 30% repeated producer writes (no-ops); relay processes SIGKILLed and SIGSTOPped past their lease; consumers SIGKILLed and stopped"
	guaranteeOutbox = "outbox → relay → broker → idem consumer: every committed event has exactly one effect (or its dead letter, for poison), no event of a rolled-back transaction ever has one; relay duplicates carry the same id"
	// relaysPerRun is the number of relay processes of an outbox scenario.
	relaysPerRun = 2
	// rollbackRate is the share of messages for which a producer also runs
	// a transaction that writes an event and rolls back.
	rollbackRate = 0.2
	roleRelay    = "relay"
)

func init() {
	scenarios = append(scenarios,
		&scenario{
			name:      "outbox-amqp-postgres",
			injects:   injectsOutbox + "; relay: cut, stall, delay (RabbitMQ, PostgreSQL)",
			guarantee: guaranteeOutbox,
			setup:     steps((*env).setupPostgres, (*env).setupAMQP, (*env).setupOrders),
			publish:   produceOutbox(spec.queue), // the default exchange: the routing key is the queue
			effects:   pgEffects,
			notes:     outboxNotes(nil),
			work:      relayOr(amqpRelay, workAMQPPostgres),
		},
		&scenario{
			name:      "outbox-nats-postgres",
			injects:   injectsOutbox + "; relay: cut, stall, delay (NATS, PostgreSQL)",
			guarantee: guaranteeOutbox,
			leased:    true,
			setup:     steps((*env).setupPostgres, (*env).setupNATS, (*env).setupOrders),
			publish:   produceOutbox(spec.subject),
			effects:   pgEffects,
			notes:     outboxNotes(natsStored),
			work:      relayOr(natsRelay, workNATSPostgres),
		},
		&scenario{
			name:      "outbox-kafka-postgres",
			injects:   injectsOutbox + "; relay: cut, stall, delay (kfake over TCP, PostgreSQL)",
			guarantee: guaranteeOutbox,
			slow:      2.5, // as kafka-postgres: the group needs time to rebalance
			setup:     steps((*env).setupPostgres, (*env).setupKafka, (*env).setupOrders),
			publish:   produceOutbox(spec.topic),
			effects:   pgEffects,
			notes:     outboxNotes(kafkaStored),
			work:      relayOr(kafkaRelay, workKafkaPostgres(true)),
		},
	)
}

// setupOrders creates the producers' business table.
func (e *env) setupOrders(ctx context.Context) error {
	_, err := e.pg.Exec(ctx, `CREATE TABLE `+pgx.Identifier{e.base.schema(), "orders"}.Sanitize()+
		` (id text PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	return err
}

// relayOr runs an outbox relay in a process whose role is "relay", the
// consumer otherwise.
func relayOr(relay, consumer func(ctx context.Context, s spec) error) func(ctx context.Context, s spec) error {
	return func(ctx context.Context, s spec) error {
		if s.Role == roleRelay {
			return relay(ctx, s)
		}
		return consumer(ctx, s)
	}
}

// runRelay runs an outbox relay over the run's PostgreSQL outbox (through
// the fault relay) with pub until ctx ends.
func runRelay(ctx context.Context, s spec, pub outbox.Publisher) error {
	st, done, err := pgStore(ctx, s)
	if err != nil {
		return err
	}
	defer done()
	r, err := outbox.NewRelay(st.Outbox(), pub, &outbox.Config{
		Workers: 2, BatchSize: 50, Lease: s.Lease, PollInterval: 50 * time.Millisecond,
		// The publishers mark an outage idem.Retryable, which the relay
		// does not count: with only 3 counted attempts, an event made
		// dead by the faults (a cut, a stall, a killed relay) would be
		// lost, and fail the run.
		Retry:           &retry.Policy{Base: 20 * time.Millisecond, Cap: 500 * time.Millisecond, MaxAttempts: 3},
		ShutdownTimeout: 5 * time.Second,
		Logger:          slog.Default(),
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

func amqpRelay(ctx context.Context, s spec) error {
	pub, err := idemamqp.NewOutboxPublisher(idemamqp.DialURL(s.AMQP), &idemamqp.OutboxConfig{ConfirmTimeout: s.Lease / 2})
	if err != nil {
		return err
	}
	defer pub.Close()
	return runRelay(ctx, s, pub)
}

func natsRelay(ctx context.Context, s spec) error {
	nc, err := nats.Connect(s.NATS, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(s.Lease))
	if err != nil {
		return err
	}
	pub, err := idemnats.NewOutboxPublisher(js, nil)
	if err != nil {
		return err
	}
	return runRelay(ctx, s, pub)
}

func kafkaRelay(ctx context.Context, s spec) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.Kafka))
	if err != nil {
		return err
	}
	defer cl.Close()
	pub, err := idemkafka.NewOutboxPublisher(cl, nil)
	if err != nil {
		return err
	}
	return runRelay(ctx, s, pub)
}

// outboxRun is an outbox scenario's state in the run process.
type outboxRun struct {
	relays                   *fleet
	stopChaos                func()
	committed, repeats, back int
}

var (
	outboxMu   sync.Mutex
	outboxRuns = map[*env]*outboxRun{}
)

// produceOutbox starts the relay processes and their faults, then runs
// the producers: one transaction per publish (the business row and the
// event; a repeated publish is the producer's retry of a transaction that
// committed, a no-op for both), and for a fifth of the messages one more
// transaction that writes an event and rolls back.
func produceOutbox(topic func(spec) string) func(e *env, ctx context.Context, msgs []publish) error {
	return func(e *env, ctx context.Context, msgs []publish) error {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		run := &outboxRun{}
		outboxMu.Lock()
		outboxRuns[e] = run
		outboxMu.Unlock()
		wlog := io.Discard
		if e.cfg.logDir != "" {
			if f, err := os.Create(filepath.Join(e.cfg.logDir, e.sc.name+".relay.log")); err == nil {
				e.onClose(func() { f.Close() })
				wlog = f
			}
		}
		base := e.base
		base.Role = roleRelay
		run.relays = newFleet(exe, base, relaysPerRun, wlog)
		cctx, cancel := context.WithCancel(context.Background())
		chaosDone := make(chan struct{})
		go func() {
			defer close(chaosDone)
			relayChaos(cctx, e, run)
		}()
		var once sync.Once
		run.stopChaos = func() { once.Do(func() { cancel(); <-chaosDone }) }
		e.onClose(func() {
			run.stopChaos()
			run.relays.close(e.cfg.shutdownBound)
			outboxMu.Lock()
			delete(outboxRuns, e)
			outboxMu.Unlock()
		})

		st, err := idempgx.New(e.pg, &idempgx.Config{Schema: e.base.schema()})
		if err != nil {
			return err
		}
		return e.produce(ctx, st.Outbox(), topic(e.base), msgs, run)
	}
}

// errRollback makes a producer transaction roll back.
var errRollback = errors.New("chaos: roll back")

// produce runs the producer transactions from four goroutines, paced at
// cfg.rate.
func (e *env) produce(ctx context.Context, ob *idempgx.Outbox, topic string, msgs []publish, run *outboxRun) error {
	type job struct {
		m        publish
		i        int
		rollback bool
	}
	rng := rand.New(rand.NewPCG(e.cfg.seed, 19))
	jobs := make(chan job)
	errs := make(chan error, 4)
	orders := pgx.Identifier{e.base.schema(), "orders"}.Sanitize()
	var wg sync.WaitGroup
	var mu sync.Mutex
	write := func(ctx context.Context, id, key, kind string, rollback bool) error {
		err := pgx.BeginFunc(ctx, e.pg, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (id) VALUES ($1) ON CONFLICT (id) DO NOTHING`, id); err != nil {
				return err
			}
			if err := outbox.Write(ctx, ob, tx, outbox.Event{Topic: topic, Key: key, ID: id,
				Payload: body(id, kind), Headers: map[string]string{"chaos-run": e.base.Run}}); err != nil {
				return err
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		if rollback && errors.Is(err, errRollback) {
			return nil
		}
		return err
	}
	for range 4 {
		wg.Go(func() {
			for j := range jobs {
				key := "k" + itoa(j.i%64)
				if err := write(ctx, j.m.id, key, j.m.kind, false); err != nil {
					errs <- fmt.Errorf("producer transaction %s: %w", j.m.id, err)
					return
				}
				if j.rollback {
					// The same kind of event, in a transaction that rolls
					// back: it must never take effect.
					if err := write(ctx, "rb"+j.m.id, key, j.m.kind, true); err != nil {
						errs <- fmt.Errorf("rolled-back transaction %s: %w", j.m.id, err)
						return
					}
				}
				mu.Lock()
				if j.m.dup {
					run.repeats++
				} else {
					run.committed++
				}
				if j.rollback {
					run.back++
				}
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	var err error
feed:
	for i, m := range msgs {
		j := job{m: m, i: i, rollback: !m.dup && rng.Float64() < rollbackRate}
		select {
		case jobs <- j:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
		if e.cfg.rate > 0 {
			if d := time.Duration(float64(i+1)/e.cfg.rate*float64(time.Second)) - time.Since(start); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// relayChaos SIGKILLs a random relay process every killEvery and SIGSTOPs
// one past its lease every zombieEvery (so that another relay takes its
// batch over and the zombie wakes up to a fenced mark), until ctx ends.
func relayChaos(ctx context.Context, e *env, run *outboxRun) {
	rng := rand.New(rand.NewPCG(e.cfg.seed, 23))
	stretch := func(d time.Duration) time.Duration { return time.Duration(float64(d) * max(e.sc.slow, 1)) }
	between := func(r [2]time.Duration) time.Duration {
		return stretch(r[0] + time.Duration(rng.Int64N(int64(r[1]-r[0])+1)))
	}
	kill := time.NewTimer(between(e.cfg.killEvery))
	stop := time.NewTimer(stretch(e.cfg.zombieEvery))
	defer kill.Stop()
	defer stop.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-kill.C:
			run.relays.kill()
			kill.Reset(between(e.cfg.killEvery))
		case <-stop.C:
			run.relays.stop(e.cfg.lease + time.Second)
			stop.Reset(stretch(e.cfg.zombieEvery))
		}
	}
}

// outboxNotes reports the producers', the relays' and the outbox's
// numbers; stored, when set, counts the messages the broker holds.
func outboxNotes(stored func(e *env, ctx context.Context) (int, error)) func(e *env, ctx context.Context) []string {
	return func(e *env, ctx context.Context) []string {
		outboxMu.Lock()
		run := outboxRuns[e]
		outboxMu.Unlock()
		if run == nil {
			return []string{"outbox: the producers never started"}
		}
		run.stopChaos()
		run.relays.mu.Lock()
		kills, stops, exits := run.relays.kills, run.relays.stops, run.relays.exits
		run.relays.mu.Unlock()
		notes := []string{fmt.Sprintf("outbox: %d events committed, %d repeated producer writes (no-ops), %d rolled-back transactions; %d relay processes: %d kills, %d stops, %d exits",
			run.committed, run.repeats, run.back, relaysPerRun, kills, stops, exits)}
		rows, err := e.pg.Query(ctx, `SELECT state, count(*) FROM `+pgx.Identifier{e.base.schema(), "idem_outbox"}.Sanitize()+` GROUP BY state ORDER BY state`)
		if err == nil {
			counts, err := collectCounts(rows)
			if err == nil {
				notes = append(notes, fmt.Sprintf("outbox rows: sent %d, pending %d, sending %d, dead %d (rolled-back events are never rows)",
					counts["sent"], counts["pending"], counts["sending"], counts["dead"]))
			}
		}
		if stored != nil {
			if n, err := stored(e, ctx); err == nil {
				notes = append(notes, fmt.Sprintf("broker: %d messages stored for %d events: %d relay repeats reached the consumers", n, run.committed, n-run.committed))
			}
		}
		return notes
	}
}

// natsStored counts the messages of the run's stream.
func natsStored(e *env, ctx context.Context) (int, error) {
	s, err := e.js.Stream(ctx, e.base.stream())
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.State.Msgs), nil
}

// kafkaStored counts the records of the run's topic: the sum of its
// partitions' end offsets.
func kafkaStored(e *env, ctx context.Context) (int, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = e.base.topic()
	for p := range int32(kafkaPartitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1 // the end offset
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, e.kcl)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return 0, err
			}
			n += int(p.Offset)
		}
	}
	return n, nil
}

// kafkaPartitions is the run topic's partition count (setupKafka).
const kafkaPartitions = 8
