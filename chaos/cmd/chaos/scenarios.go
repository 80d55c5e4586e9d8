package main

import (
	"context"
	"strings"
)

// scenario is one broker + store combination: how to set up its private
// resources, publish, read its effects and dead letters, and run a worker.
type scenario struct {
	name string
	// injects and guarantee are the fault table's columns (RELIABILITY.md).
	injects, guarantee string
	// edge marks a scenario that measures a documented edge: a duplicated
	// effect is reported, not a failure (a lost one still fails).
	edge bool
	// leased: the zombie stays stopped past the lease (Guard, inbox) or
	// the AckWait (NATS), so that another worker takes its work over.
	leased bool
	// restart names a server the scenario runs privately and crashes
	// (SIGKILL) and starts again during the run: "nats" or "redis". A
	// private broker is crashed only once everything is published.
	restart string
	// calm injects no other fault (no kills, stops or relay faults), so
	// that what the scenario measures is the restart's alone.
	calm bool
	// heavy leaves the scenario out of -quick unless it is named.
	heavy bool
	// slow stretches the time between two faults of each kind (default 1).
	slow float64

	setup   func(e *env, ctx context.Context) error
	publish func(e *env, ctx context.Context, msgs []publish) error
	// effects counts effect rows per message id.
	effects func(e *env, ctx context.Context) (map[string]int, error)
	// calls counts downstream calls per message id (lease path only).
	calls func(e *env, ctx context.Context) (map[string]int, error)
	// refreshDead updates e.dead for stores read by query (the inbox).
	refreshDead func(e *env, ctx context.Context) error
	work        func(ctx context.Context, s spec) error
	// notes, when set, adds lines to the report (after the check).
	notes func(e *env, ctx context.Context) []string
}

func steps(fs ...func(*env, context.Context) error) func(*env, context.Context) error {
	return func(e *env, ctx context.Context) error {
		for _, f := range fs {
			if err := f(e, ctx); err != nil {
				return err
			}
		}
		return nil
	}
}

func pgEffects(e *env, ctx context.Context) (map[string]int, error) {
	return e.pgCounts(ctx, "effects")
}
func pgCalls(e *env, ctx context.Context) (map[string]int, error) { return e.pgCounts(ctx, "calls") }

const (
	injectsBroker = "SIGKILL of consumers, SIGSTOP/SIGCONT zombies, 30% duplicate publishes, 1% poison"
	guaranteeTx   = "transactional path: effect and dedupe record in one transaction: 0 lost, 0 duplicated, every poison message dead-lettered with its reason"
)

var scenarios = []*scenario{
	{
		name:      "amqp-postgres",
		injects:   injectsBroker + "; relay: cut, stall, delay (RabbitMQ, PostgreSQL)",
		guarantee: guaranteeTx,
		setup:     steps((*env).setupPostgres, (*env).setupAMQP),
		publish:   (*env).publishAMQP,
		effects:   pgEffects,
		work:      workAMQPPostgres,
	},
	{
		name:      "amqp-sqlite",
		injects:   injectsBroker + "; relay: cut, stall, delay (RabbitMQ); several processes on one SQLite file",
		guarantee: guaranteeTx,
		setup:     steps((*env).setupSQLite, (*env).setupAMQP),
		publish:   (*env).publishAMQP,
		effects:   (*env).sqliteCounts,
		work:      workAMQPSQLite,
	},
	{
		name:      "nats-postgres",
		injects:   injectsBroker + " (zombies past AckWait); relay: cut, stall, delay (NATS, PostgreSQL)",
		guarantee: guaranteeTx,
		leased:    true,
		setup:     steps((*env).setupPostgres, (*env).setupNATS),
		publish:   (*env).publishNATS,
		effects:   pgEffects,
		work:      workNATSPostgres,
	},
	{
		name:      "kafka-postgres",
		injects:   injectsBroker + " (static group members); relay: cut, stall, delay (kfake over TCP, PostgreSQL)",
		guarantee: guaranteeTx,
		// A killed or cut member's partitions move after its session
		// timeout and a rebalance; faults more often than that keep the
		// group rebalancing, and nothing is consumed.
		slow:    2.5,
		setup:   steps((*env).setupPostgres, (*env).setupKafka),
		publish: (*env).publishKafka,
		effects: pgEffects,
		work:    workKafkaPostgres(true),
	},
	{
		name:      "kafka-dynamic-postgres",
		injects:   injectsBroker + " (dynamic group members: every kill is two rebalances); relay: cut, stall, delay (kfake over TCP, PostgreSQL)",
		guarantee: guaranteeTx,
		// A killed or cut member's partitions move after its session
		// timeout and a rebalance; faults more often than that keep the
		// group rebalancing, and nothing is consumed.
		slow:    2.5,
		heavy:   true,
		setup:   steps((*env).setupPostgres, (*env).setupKafka),
		publish: (*env).publishKafka,
		effects: pgEffects,
		work:    workKafkaPostgres(false),
	},
	{
		name:        "inbox-postgres",
		injects:     "SIGKILL of inbox workers, SIGSTOP zombies past their lease, 30% duplicate receives, 1% poison; relay: cut, stall, delay (PostgreSQL)",
		guarantee:   "inbox: effect and processed mark in one transaction fenced by the lease token: 0 lost, 0 duplicated, poison rows dead with their reason",
		leased:      true,
		setup:       (*env).setupPostgres,
		publish:     (*env).publishInbox,
		effects:     pgEffects,
		refreshDead: (*env).inboxDead,
		work:        workInboxPostgres,
	},
	{
		name:      "guard-redis",
		injects:   injectsBroker + " (zombies past the lease and AckWait); relay: cut, stall, delay (NATS, Redis)",
		guarantee: "lease path with Run.DownstreamKey: the downstream deduplicates a takeover's repeated call: 0 lost, 0 duplicated effects (repeated calls counted)",
		leased:    true,
		setup:     steps((*env).setupPostgres, (*env).setupRedis, (*env).setupNATS),
		publish:   (*env).publishNATS,
		effects:   pgEffects,
		calls:     pgCalls,
		work:      workGuardRedis(true),
	},
	{
		name:      "edge-guard-redis-nokey",
		injects:   "as guard-redis, but the downstream call carries no idempotency key",
		guarantee: "documented edge (lease path without DownstreamKey): at most once per lease, so a zombie resuming after a takeover repeats its effect; measured, not failed (0 lost still checked)",
		edge:      true,
		leased:    true,
		setup:     steps((*env).setupPostgres, (*env).setupRedis, (*env).setupNATS),
		publish:   (*env).publishNATS,
		effects:   pgEffects,
		calls:     pgCalls,
		work:      workGuardRedis(false),
	},
}

func init() {
	scenarios = append(scenarios,
		&scenario{
			name:      "nats-restart-postgres",
			injects:   injectsBroker + "; a private nats-server (JetStream, file storage) SIGKILLed and restarted mid-run",
			guarantee: guaranteeTx + ", across broker crashes",
			leased:    true,
			restart:   "nats",
			setup:     steps((*env).setupPostgres, (*env).setupNATS),
			publish:   (*env).publishNATS,
			effects:   pgEffects,
			work:      workNATSPostgres,
		},
		&scenario{
			name:      "edge-redis-restart",
			injects:   "a private redis-server without persistence SIGKILLed and restarted mid-run under the lease path (no key downstream); no other fault",
			guarantee: "documented edge (Redis durability): records written since the last persisted point are lost in a crash, so a redelivery or duplicate publish after it runs again; measured, not failed (0 lost still checked)",
			edge:      true,
			calm:      true,
			restart:   "redis",
			setup:     steps((*env).setupPostgres, (*env).setupRedis, (*env).setupNATS),
			publish:   (*env).publishNATS,
			effects:   pgEffects,
			calls:     pgCalls,
			work:      workGuardRedis(false),
		},
	)
}

func scenarioByName(name string) (*scenario, bool) {
	for _, s := range scenarios {
		if s.name == name {
			return s, true
		}
	}
	return nil, false
}

// selectScenarios returns the scenarios named in a comma-separated list
// (all when it is empty or "all", but the heavy ones in quick mode);
// unknown names are returned apart.
func selectScenarios(list string, quick bool) (sel []*scenario, unknown []string) {
	if list == "" || list == "all" {
		for _, s := range scenarios {
			if !quick || !s.heavy {
				sel = append(sel, s)
			}
		}
		return sel, nil
	}
	for _, n := range strings.Split(list, ",") {
		if s, ok := scenarioByName(strings.TrimSpace(n)); ok {
			sel = append(sel, s)
		} else {
			unknown = append(unknown, n)
		}
	}
	return sel, unknown
}
