package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/jackc/pgx/v5"
)

func TestStepsConformance(t *testing.T) {
	t.Parallel()
	testPool(t)
	storetest.RunSteps(t, func(t *testing.T) idem.Store { return newStore(t, nil) },
		&storetest.Options{ClockPrecision: time.Microsecond})
}

// The steps keep their contract on the time-partitioned layout, whose
// takeovers move a record to another partition.
func TestStepsConformancePartitioned(t *testing.T) {
	t.Parallel()
	testPool(t)
	storetest.RunSteps(t, func(t *testing.T) idem.Store { return newPartitionedStore(t, nil) },
		&storetest.Options{ClockPrecision: time.Microsecond})
}

// stepTxEnv adapts DoStepTx to the suite: the effect is a row of an
// effects table in the store's schema, written in the step's transaction.
type stepTxEnv struct{ *processEnv }

func (e stepTxEnv) Store() idem.Store { return e.s }

func (e stepTxEnv) DoStepTx(ctx context.Context, req idem.StepRequest, result []byte, fail error) (idem.StepRecord, error) {
	return e.s.DoStepTx(ctx, req, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := tx.Exec(ctx, "INSERT INTO "+e.effects+" (key) VALUES ($1)", req.Name); err != nil {
			return nil, err
		}
		return result, fail
	})
}

func TestStepsTxConformance(t *testing.T) {
	t.Parallel()
	testPool(t)
	storetest.RunStepsTx(t, func(t *testing.T) storetest.StepTxEnv { return stepTxEnv{newProcessEnv(t)} })
}

// Purge removes expired steps after the records, in batches.
func TestPurgeSteps(t *testing.T) {
	t.Parallel()
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
	if err := s.Pool().QueryRow(ctx, "SELECT count(*) FROM "+qualified(s, "idem_steps")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("Purge left %d expired steps", n)
	}
}
