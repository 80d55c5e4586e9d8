package idemamqp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"

	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func amqpURL(t testing.TB) string {
	return idemtest.ServiceURL(t, "IDEM_AMQP_URL")
}

func suffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newTopology declares a uniquely named topology and deletes it at cleanup.
func newTopology(t testing.TB) (idemamqp.Topology, *amqp.Connection) {
	t.Helper()
	conn, err := amqp.Dial(amqpURL(t))
	if err != nil {
		t.Fatal(err)
	}
	topo := idemamqp.Topology{Queue: "idemtest." + strings.ReplaceAll(t.Name(), "/", ".") + "." + suffix()}.WithDefaults()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := idemamqp.Declare(ch, topo); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			if err := idemamqp.Delete(ch, topo); err != nil {
				t.Log(err)
			}
			ch.Close()
		}
		conn.Close()
	})
	return topo, conn
}

// publish sends body with id to the work queue n times.
func publish(t testing.TB, conn *amqp.Connection, queue, id string, body []byte, n int) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := idemamqp.Publish(context.Background(), ch, "", queue, amqp.Publishing{MessageId: id, Body: body}); err != nil {
			t.Fatal(err)
		}
	}
}

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

// pgEnv is an isolated schema with idem's tables and a balances table.
type pgEnv struct {
	pool   *pgxpool.Pool
	store  *idempgx.Store
	schema string
}

func newPG(t testing.TB) *pgEnv {
	t.Helper()
	e := attachPG(t, "idemamqp_"+suffix())
	ctx := context.Background()
	m, err := idempgx.NewMigrator(e.pool, &idempgx.MigratorConfig{Schema: e.schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (account text PRIMARY KEY, amount bigint NOT NULL, applied int NOT NULL DEFAULT 0)`, e.table())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.pool.Exec(context.Background(), fmt.Sprintf("DROP SCHEMA %s CASCADE", pgx.Identifier{e.schema}.Sanitize()))
	})
	return e
}

// attachPG opens the store over an existing schema.
func attachPG(t testing.TB, schema string) *pgEnv {
	t.Helper()
	url := idemtest.ServiceURL(t, "IDEM_POSTGRES_URL")
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 16
		pool, poolErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if poolErr != nil {
		t.Fatal(poolErr)
	}
	st, err := idempgx.New(pool, &idempgx.Config{Schema: schema, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return &pgEnv{pool: pool, store: st, schema: schema}
}

func (e *pgEnv) table() string { return pgx.Identifier{e.schema, "balances"}.Sanitize() }

// credit adds amount to account inside tx: the non-idempotent effect.
func (e *pgEnv) credit(ctx context.Context, tx pgx.Tx, account string, amount int64) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (account, amount, applied) VALUES ($1, $2, 1)
		ON CONFLICT (account) DO UPDATE SET amount = balances.amount + EXCLUDED.amount, applied = balances.applied + 1`, e.table()), account, amount)
	return err
}

func (e *pgEnv) balance(t testing.TB, account string) (amount int64, applied int) {
	t.Helper()
	err := e.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT amount, applied FROM %s WHERE account = $1`, e.table()), account).Scan(&amount, &applied)
	if err == pgx.ErrNoRows {
		return 0, 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return amount, applied
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runConsumer runs c until the test ends.
func runConsumer(t testing.TB, c *idemamqp.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
