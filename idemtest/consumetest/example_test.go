package consumetest_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/consumetest"
)

// A test of a consumer on the transactional path: the dedupe record and
// the credit commit in one transaction of an idem.Processor (an
// *idemsqlite.Store, opened on a file under consumetest.Dir so that the
// kill scenario's child processes use the same database). The two Points
// let the kit cancel, panic and SIGKILL right before the credit and
// between the credit and the commit.
func ExampleRun() {
	var store interface {
		idem.Processor[*sql.Tx]
		DB() *sql.DB
	} // e.g. idemsqlite.Open(ctx, "sqlite://"+filepath.Join(consumetest.Dir(t), "ledger.db"), nil)

	testPayments := func(t *testing.T) {
		consumetest.Run(t, consumetest.Target{
			Deliver: func(ctx context.Context, d consumetest.Delivery) error {
				msg := idem.Message{Scope: "payments", Key: d.ID, Fingerprint: idem.FingerprintBytes(d.Body)}
				res, err := store.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
					consumetest.Point(ctx)
					_, err := tx.ExecContext(ctx, `INSERT INTO credits (payment_id, cents) VALUES (?, 100)`, d.ID)
					consumetest.Point(ctx)
					return err
				})
				if err == nil && res == idem.Mismatch {
					err = idem.ErrFingerprintMismatch // rejected, as consumers dead-letter it
				}
				return err
			},
			Effects: func(ctx context.Context, id string) (n int, err error) {
				err = store.DB().QueryRowContext(ctx, `SELECT count(*) FROM credits WHERE payment_id = ?`, id).Scan(&n)
				return n, err
			},
			Subprocess: true,
		}, nil)
	}
	_ = testPayments
}

// Report renders the table Run logs; a test may also read its rows.
func ExampleReport_String() {
	rep := consumetest.Report{Points: 1, Scenarios: []consumetest.ScenarioResult{
		{Scenario: consumetest.Twice, Messages: 4, Deliveries: 8, Effects: 8, Duplicated: 4, Failures: []string{"…"}},
		{Scenario: consumetest.ChangedBody, Messages: 4, Deliveries: 12, Failed: 4, Effects: 4, Verdict: consumetest.Rejected},
		{Scenario: consumetest.Kill, Skipped: "Target.Subprocess is not set"},
	}}
	fmt.Println(rep)
	// Output:
	// 3 scenarios: 1 passed, 1 failed, 1 skipped; 1 point in the handler
	// scenario      messages  deliveries  failed  effects  lost  duplicated  result
	// twice         4         8           0       8        0     4           FAIL
	// changed-body  4         12          4       4        0     0           ok    rejected
	// kill          -         -           -       -        -     -           SKIP  Target.Subprocess is not set
}
