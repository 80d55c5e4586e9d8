package idemsqlite

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
	storetest.RunSteps(t, func(t *testing.T) idem.Store { return newTestStore(t, nil) },
		&storetest.Options{ClockPrecision: time.Microsecond})
}

// stepTxEnv adapts DoStepTx to the suite: the effect is a row of an
// effects table in the same database, written in the step's transaction.
type stepTxEnv struct{ s *Store }

func (e stepTxEnv) Store() idem.Store { return e.s }

func (e stepTxEnv) DoStepTx(ctx context.Context, req idem.StepRequest, result []byte, fail error) (idem.StepRecord, error) {
	return e.s.DoStepTx(ctx, req, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		if err := insertEffect(ctx, tx, req.Name); err != nil {
			return nil, err
		}
		return result, fail
	})
}

func (e stepTxEnv) Effects(ctx context.Context) (map[string]int, error) {
	return countEffects(ctx, e.s.DB())
}

func TestStepsTxConformance(t *testing.T) {
	t.Parallel()
	storetest.RunStepsTx(t, func(t *testing.T) storetest.StepTxEnv {
		s := newTestStore(t, nil)
		createEffects(t, s.DB())
		return stepTxEnv{s}
	})
}

// Purge removes expired steps with the expired records, in batches.
func TestPurgeSteps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newTestStore(t, nil)
	now := time.Now()
	s.now = func() time.Time { return now }
	for i := range 5 {
		key := string(rune('a' + i))
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "p", Key: key, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.RecordStep(ctx, idem.StepRequest{Scope: "p", Key: key, Token: c.Token, Name: "one", Retention: time.Second}); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, "p", key, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(2 * time.Second)
	if _, err := s.Purge(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.DB().QueryRow("SELECT count(*) FROM idem_steps").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("Purge left %d expired steps", n)
	}
}
