package idemnats_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// natsURL returns IDEM_NATS_URL, skipping locally and failing in CI
// without it.
func natsURL(t *testing.T) string {
	t.Helper()
	return idemtest.ServiceURL(t, "IDEM_NATS_URL")
}

func suffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// env is one test's stream, dead-letter stream and store.
type env struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  string
	subject string // the work subject
	dlq     string // the dead-letter subject
	store   *idemsqlite.Store
}

// connect opens a connection of its own to IDEM_NATS_URL (closed at
// cleanup): one consumer process.
func connect(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(natsURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// newEnv creates uniquely named work and dead-letter streams (deleted at
// cleanup) and a migrated SQLite store with an effects table.
func newEnv(t *testing.T, dupWindow time.Duration) *env {
	t.Helper()
	ctx := context.Background()
	nc, js := connect(t)
	s := suffix()
	e := &env{nc: nc, js: js, stream: "IDEMTEST_" + s, subject: "idemtest." + s + ".work", dlq: "idemtest." + s + ".dlq"}
	for _, sc := range []jetstream.StreamConfig{
		{Name: e.stream, Subjects: []string{e.subject}, Duplicates: dupWindow, Storage: jetstream.MemoryStorage},
		{Name: e.stream + "_DLQ", Subjects: []string{e.dlq}, Storage: jetstream.MemoryStorage},
	} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		name := sc.Name
		t.Cleanup(func() {
			if err := js.DeleteStream(context.Background(), name); err != nil {
				t.Log(err)
			}
		})
	}
	st, err := idemsqlite.Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{AutoMigrate: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE effects (key TEXT NOT NULL, body BLOB NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.store = st
	return e
}

// consumer creates a durable consumer named name on the work stream.
func (e *env) consumer(t *testing.T, name string, ackWait time.Duration, maxDeliver int) {
	t.Helper()
	_, err := e.js.CreateOrUpdateConsumer(context.Background(), e.stream, jetstream.ConsumerConfig{
		Durable: name, AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: maxDeliver,
	})
	if err != nil {
		t.Fatal(err)
	}
}

// process is a ProcessFunc recording one effects row per processed
// message in the dedupe record's transaction; handler may fail it first.
func (e *env) process(handler func(d consume.Delivery) error) consume.ProcessFunc {
	return func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
		return e.store.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			if handler != nil {
				if err := handler(d); err != nil {
					return err
				}
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO effects (key, body) VALUES (?, ?)`, msg.Key, d.Body())
			return err
		})
	}
}

// effects returns the number of effects per key.
func (e *env) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.store.DB().Query(`SELECT key, count(*) FROM effects GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		m[k] = n
	}
	return m
}

// run starts c in the background and stops it at cleanup (or with the
// returned stop).
func run(t *testing.T, c *idemnats.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			t.Error(err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
