// Package demo is the README's main job: a payments ledger on the embedded
// SQLite store fed duplicate deliveries (a naive consumer against idem's),
// then parallel retries of one payment through the idemhttp middleware.
//
// Both `idem demo` and the small command in cmd/idem/demo run it; the
// latter imports only idem, idemhttp, idemsqlite and the standard library,
// so its first `go run` compiles far less than the whole CLI.
package demo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsqlite"
)

// Short is the demo's one-line description.
const Short = "Feed a payments ledger duplicate deliveries: naive consumer vs idem (no server needed)"

// Long is the demo's help text.
const Long = `A payments ledger on the embedded SQLite store. The same stream of payment
messages, with duplicates (some delivered 3 times) in a random order and a
consumer crash after commit but before ack (so the broker delivers that message
again), is fed to two consumers:

  naive  balance += amount, no dedupe
  idem   the dedupe record and the balance update commit in one transaction
         (idemsqlite Process); a duplicate hits the unique key and is skipped

The idem consumer then runs once more with several goroutines at once and
the copies of each message queued back to back, so duplicates race each other
and the database serialises them.

Then the payments HTTP API runs behind the idemhttp middleware on the same
store (a loopback server): --requests copies of one payment POST with one
Idempotency-Key are sent at once. Exactly one charge must happen and every
other response must be the original's, byte for byte (retries in flight wait
for it; a 409 is retried until it replays).

The exit status is 0 only when the idem balances are exact, the payment was
charged once and every retry replayed the original response. The stream depends
only on --seed. --store defaults to a temporary file; IDEM_STORE is not read
here, so the demo never writes its tables into your real store by accident.`

// Options are the demo's flags.
type Options struct {
	// Store is sqlite://PATH ("": a temporary file, removed after).
	Store string
	// Seed decides the delivery order and the amounts.
	Seed uint64
	// Messages is the number of distinct payment messages.
	Messages int
	// Workers is the goroutines of the concurrent idem run (0 skips it).
	Workers int
	// Requests is the parallel retries of one payment through the HTTP
	// middleware (0 skips the HTTP exercise).
	Requests int
}

// Defaults are the flags' defaults.
var Defaults = Options{Seed: 1, Messages: 100, Workers: 8, Requests: 100}

// UsageError is an option out of its bounds: the command line's fault.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &UsageError{fmt.Sprintf(format, args...)}
}

// notSQLite names what a --store that is not sqlite:// is without repeating
// it: a DSN may hold a password.
func notSQLite(dsn string) string {
	if scheme, _, ok := strings.Cut(dsn, "://"); ok {
		return fmt.Sprintf("a %s:// URL", scheme)
	}
	return "no URL"
}

// Bounds that keep the demo a demo.
const (
	maxDemoMessages = 100000
	maxDemoWorkers  = 256
)

// Run runs the demo with o and writes its report to out. The error is nil
// only when the idem balances are exact, the payment was charged once and
// every retry replayed the original response; a [*UsageError] is a bad
// option.
func Run(ctx context.Context, out io.Writer, o Options) error {
	if o.Messages < 1 || o.Messages > maxDemoMessages {
		return usageErrorf("--messages must be between 1 and %d, got %d", maxDemoMessages, o.Messages)
	}
	if o.Workers < 0 || o.Workers > maxDemoWorkers {
		return usageErrorf("--workers must be between 0 and %d, got %d", maxDemoWorkers, o.Workers)
	}
	if o.Requests < 0 || o.Requests > maxDemoRequests {
		return usageErrorf("--requests must be between 0 and %d, got %d", maxDemoRequests, o.Requests)
	}
	where := "a temporary file"
	dsn := o.Store
	if dsn == "" {
		dir, err := os.MkdirTemp("", "idem-demo-")
		if err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		defer os.RemoveAll(dir)
		dsn = "sqlite://" + filepath.Join(dir, "ledger.db")
	} else {
		if !strings.HasPrefix(dsn, "sqlite://") {
			return usageErrorf("demo runs on the embedded SQLite store: --store must be sqlite://PATH, got %s", notSQLite(dsn))
		}
		where = strings.TrimPrefix(dsn, "sqlite://")
	}
	store, err := idemsqlite.Open(ctx, dsn, &idemsqlite.Config{
		AutoMigrate: true,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return fmt.Errorf("demo: open %s: %w", dsn, err)
	}
	defer store.Close()

	l, err := newLedger(ctx, store)
	if err != nil {
		return err
	}
	s := newDemoStream(o.Seed, o.Messages)
	res := demoResult{
		Messages:   len(s.Payments),
		Deliveries: len(s.Deliveries) + 1, // the crash's redelivery
		Tripled:    s.Tripled,
		Expected:   s.expected(),
		Workers:    o.Workers,
	}
	if _, err := deliver(ctx, s, l.naive); err != nil {
		return fmt.Errorf("demo: naive consumer: %w", err)
	}
	st, err := deliver(ctx, s, l.idem(l.scope+"/sequential", l.account+"/idem"))
	if err != nil {
		return fmt.Errorf("demo: idem consumer: %w", err)
	}
	res.Skipped = st.Skipped
	if o.Workers > 0 {
		st, err := deliverConcurrently(ctx, s, o.Workers, l.idem(l.scope+"/concurrent", l.account+"/idem-concurrent"))
		if err != nil {
			return fmt.Errorf("demo: concurrent idem consumer: %w", err)
		}
		res.ConcurrentSkipped = st.Skipped
	}
	if res.Naive, err = l.balance(ctx, l.account+"/naive"); err != nil {
		return err
	}
	if res.Idem, err = l.balance(ctx, l.account+"/idem"); err != nil {
		return err
	}
	if o.Workers > 0 {
		if res.Concurrent, err = l.balance(ctx, l.account+"/idem-concurrent"); err != nil {
			return err
		}
	}

	fmt.Fprintf(out, "idem demo: a payments ledger on SQLite (%s), seed %d\n\n", where, o.Seed)
	writeTable(out, res)
	fmt.Fprintln(out)
	if err := verdict(res); err != nil {
		return err
	}
	fmt.Fprintf(out, "OK: the idem consumer applied each of the %d payments exactly once despite %d duplicate deliveries; the naive one is off by %s.\n",
		res.Messages, res.Deliveries-res.Messages, dollars(res.Naive-res.Expected))
	if o.Requests == 0 {
		return nil
	}

	hr, err := runPaymentRetries(ctx, store, l.account+"/payment-1", o.Requests)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nidem demo: %d parallel retries of one payment through the idemhttp middleware (same store, loopback HTTP)\n\n", o.Requests)
	writeHTTPTable(out, hr)
	fmt.Fprintln(out)
	if err := httpVerdict(hr); err != nil {
		return err
	}
	fmt.Fprintf(out, "OK: one charge; the other %d requests got the original %d response, byte for byte.\n", hr.Requests-1, hr.Status)
	return nil
}

// ledger is the demo's balance table beside the idem records, with one
// account per consumer of this run.
type ledger struct {
	store *idemsqlite.Store
	// scope and account are unique to this run, so repeated runs on the
	// same --store never see each other's dedupe records or balances.
	scope, account string
}

func newLedger(ctx context.Context, store *idemsqlite.Store) (*ledger, error) {
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	l := &ledger{store: store, scope: "idem-demo/" + run, account: "demo-" + run}
	db := store.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS idem_demo_ledger (
	account       TEXT    PRIMARY KEY,
	balance_cents INTEGER NOT NULL
)`); err != nil {
		return nil, fmt.Errorf("demo: create ledger: %w", err)
	}
	for _, acct := range []string{"/naive", "/idem", "/idem-concurrent"} {
		if _, err := db.ExecContext(ctx, "INSERT INTO idem_demo_ledger (account, balance_cents) VALUES (?, 0)", l.account+acct); err != nil {
			return nil, fmt.Errorf("demo: create account: %w", err)
		}
	}
	return l, nil
}

const creditSQL = "UPDATE idem_demo_ledger SET balance_cents = balance_cents + ? WHERE account = ?"

// naive is the consumer most code starts with: apply every delivery.
func (l *ledger) naive(ctx context.Context, p payment) (bool, error) {
	_, err := l.store.DB().ExecContext(ctx, creditSQL, p.Cents, l.account+"/naive")
	return false, err
}

// idem returns the consumer that commits the dedupe record and the credit
// in one transaction. A retryable error (the database was busy) is what a
// broker answers with a redelivery; the consumer retries a few times itself.
func (l *ledger) idem(scope, account string) consumer {
	return func(ctx context.Context, p payment) (bool, error) {
		msg := idem.Message{
			Scope:       scope,
			Key:         p.ID,
			Fingerprint: idem.FingerprintParts([]byte(p.ID), []byte(strconv.FormatInt(p.Cents, 10))),
		}
		for attempt := 1; ; attempt++ {
			res, err := l.store.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, creditSQL, p.Cents, account)
				return err
			})
			if err != nil && idem.IsRetryable(err) && attempt < 5 {
				continue
			}
			if err != nil {
				return false, err
			}
			if res == idem.Mismatch {
				return false, errors.New("fingerprint mismatch")
			}
			return res == idem.Duplicate, nil
		}
	}
}

func (l *ledger) balance(ctx context.Context, account string) (int64, error) {
	var cents int64
	err := l.store.DB().QueryRowContext(ctx, "SELECT balance_cents FROM idem_demo_ledger WHERE account = ?", account).Scan(&cents)
	if err != nil {
		return 0, fmt.Errorf("demo: read balance: %w", err)
	}
	return cents, nil
}
