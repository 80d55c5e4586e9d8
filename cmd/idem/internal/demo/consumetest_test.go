package demo

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/consumetest"
	"github.com/idem-go/idem/store/idemsqlite"
)

// TestDemoLedgerConsumetest is the worked example of consumetest on the
// demo's ledger (the dedupe record and the credit in one SQLite
// transaction). Every message credits $1.00 to an account of its own, so
// the account's balance in whole dollars is the number of times the
// message took effect. The database file lives in consumetest.Dir, so the
// child processes of the kill scenario, which run the subtest again up to
// Run, credit the same ledger; the scope and the account names are fixed
// for the same reason.
//
//   - as-is runs the demo's consumer (ledger.idem) unchanged: without
//     consumetest.Point, the cancellations and kills land at delays spread
//     over its measured duration, and no panic is injected;
//   - points runs the same transaction with a Point before and after the
//     credit, so that every fault lands at both places: a SIGKILL between
//     the credit and the commit must lose nothing and apply nothing twice.
func TestDemoLedgerConsumetest(t *testing.T) {
	t.Parallel()
	t.Run("as-is", func(t *testing.T) {
		t.Parallel()
		testDemoLedger(t, nil, func(ctx context.Context, l *ledger, account string, p payment) error {
			_, err := l.idem(l.scope, account)(ctx, p)
			return err
		})
	})
	t.Run("points", func(t *testing.T) {
		t.Parallel()
		// The panic scenario found that idemsqlite's Process left its
		// transaction open, holding SQLite's write lock, when the handler
		// panicked; it now proves the fix (a panic between the credit and
		// the commit applies nothing, the redelivery applies it once).
		rep := testDemoLedger(t, nil, func(ctx context.Context, l *ledger, account string, p payment) error {
			msg := idem.Message{Scope: l.scope, Key: p.ID, Fingerprint: idem.FingerprintParts([]byte(p.ID), []byte(strconv.FormatInt(p.Cents, 10)))}
			res, err := l.store.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
				consumetest.Point(ctx)
				_, err := tx.ExecContext(ctx, creditSQL, p.Cents, account)
				consumetest.Point(ctx)
				return err
			})
			if err == nil && res == idem.Mismatch {
				err = errors.New("fingerprint mismatch")
			}
			return err
		})
		if rep.Points != 2 {
			t.Errorf("%d points, want 2", rep.Points)
		}
	})
}

// testDemoLedger runs consumetest on credit, a consumer of the demo's
// ledger.
func testDemoLedger(t *testing.T, skip []consumetest.Scenario, credit func(ctx context.Context, l *ledger, account string, p payment) error) consumetest.Report {
	ctx := context.Background()
	store, err := idemsqlite.Open(ctx, "sqlite://"+filepath.Join(consumetest.Dir(t), "ledger.db"),
		&idemsqlite.Config{AutoMigrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	l, err := newLedger(ctx, store) // creates the table
	if err != nil {
		t.Fatal(err)
	}
	l.scope, l.account = "consumetest", "consumetest"
	account := func(id string) string { return l.account + "/" + id }

	rep := consumetest.Run(t, consumetest.Target{
		Deliver: func(ctx context.Context, d consumetest.Delivery) error {
			var p payment
			if err := json.Unmarshal(d.Body, &p); err != nil {
				return err
			}
			p.ID = d.ID
			if _, err := store.DB().ExecContext(ctx,
				"INSERT OR IGNORE INTO idem_demo_ledger (account, balance_cents) VALUES (?, 0)", account(d.ID)); err != nil {
				return err
			}
			return credit(ctx, l, account(d.ID), p)
		},
		Effects: func(ctx context.Context, id string) (int, error) {
			cents, err := l.balance(ctx, account(id))
			if errors.Is(err, sql.ErrNoRows) {
				return 0, nil
			}
			return int(cents / 100), err
		},
		Subprocess: true,
	}, &consumetest.Options{
		Skip: skip,
		// $1.00, and $1.01 for the changed body: applying it would make $2.01.
		Body: func(_ string, variant int) []byte { return fmt.Appendf(nil, `{"Cents":%d}`, 100+variant) },
	})
	if s, _ := rep.Scenario(consumetest.ChangedBody); s.Verdict != consumetest.Rejected {
		t.Errorf("the verdict on a changed body: %v, want rejected (a fingerprint mismatch)", s.Verdict)
	}
	if s, _ := rep.Scenario(consumetest.Kill); s.Skipped != "" {
		t.Errorf("kill scenario skipped: %s", s.Skipped)
	}
	return rep
}
