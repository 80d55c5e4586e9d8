package idemmysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
)

func TestStepsConformance(t *testing.T) {
	t.Parallel()
	adminDB(t)
	storetest.RunSteps(t, func(t *testing.T) idem.Store { return newStore(t, nil) },
		&storetest.Options{ClockPrecision: time.Microsecond})
}

// stepTxEnv adapts DoStepTx to the suite: the effect is a row of an
// effects table in the test's database, written in the step's transaction.
type stepTxEnv struct{ *processEnv }

func (e stepTxEnv) Store() idem.Store { return e.s }

func (e stepTxEnv) DoStepTx(ctx context.Context, req idem.StepRequest, result []byte, fail error) (idem.StepRecord, error) {
	return e.s.DoStepTx(ctx, req, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if _, err := tx.ExecContext(ctx, "INSERT INTO effects (`key`) VALUES (?)", req.Name); err != nil {
			return nil, err
		}
		return result, fail
	})
}

func TestStepsTxConformance(t *testing.T) {
	t.Parallel()
	adminDB(t)
	storetest.RunStepsTx(t, func(t *testing.T) storetest.StepTxEnv { return stepTxEnv{newProcessEnv(t)} })
}

// Purge removes expired steps after the records, in batches.
func TestPurgeSteps(t *testing.T) {
	t.Parallel()
	adminDB(t)
	ctx := ctxT(t)
	s := newStore(t, nil)
	for _, key := range []string{"a", "b", "c", "d", "e"} {
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "p", Key: key, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.RecordStep(ctx, idem.StepRequest{Scope: "p", Key: key, Token: c.Token, Name: "one", Retention: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, "p", key, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	if _, err := s.Purge(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_steps").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("Purge left %d expired steps", n)
	}
}
