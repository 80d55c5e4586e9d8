package idempgx_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// The first statement of Process inserts the record and reads the one that
// stopped it from its snapshot. These tests hold a record in another
// transaction, make the statement wait on it (so that its snapshot is older
// than the record's commit), commit, and check the outcome: the record the
// snapshot missed must be looked up again, and a record deleted after the
// snapshot must not hide a fresh insert. ProcessBatch, whose lookup is a
// statement of its own, must see such records too.

// newRaceEnv returns a process env on a pool of its own, whose lock waits
// the returned func counts.
func newRaceEnv(t *testing.T, partitioned bool) (*processEnv, func() int) {
	t.Helper()
	var schema string
	if partitioned {
		schema = newPartitionedStore(t, nil).Config().Schema
	} else {
		schema = migratedSchema(t)
	}
	p := ownPool(t, 4)
	s, err := idempgx.New(p, &idempgx.Config{Schema: schema, Partitioned: partitioned})
	if err != nil {
		t.Fatal(err)
	}
	return newProcessEnvOn(t, s), func() int { return lockWaiters(t, p) }
}

// inOtherTx runs fn in a transaction of the shared test pool and returns
// it uncommitted.
func inOtherTx(t *testing.T, fn func(tx pgx.Tx) error) pgx.Tx {
	t.Helper()
	tx, err := testPool(t).Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if err := fn(tx); err != nil {
		t.Fatal(err)
	}
	return tx
}

// whileWaiting starts call, waits until it waits on a lock, runs release,
// and returns call's error.
func whileWaiting(t *testing.T, waiters func() int, release func() error, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	waitUntil(t, func() string { return "the call never waited on the other transaction's record" }, func() bool {
		select {
		case err := <-done:
			t.Fatalf("the call returned before the other transaction ended: %v", err)
		default:
		}
		return waiters() == 1
	})
	if err := release(); err != nil {
		t.Fatal(err)
	}
	return <-done
}

func TestProcessSeesRecordCommittedDuringInsert(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			t.Parallel()
			e, waiters := newRaceEnv(t, partitioned)
			ctx := ctxT(t)
			for _, tc := range []struct {
				key   string
				other idem.Fingerprint
				want  idem.Outcome
			}{
				{"same", fp("v1"), idem.Duplicate},
				{"other", fp("v2"), idem.Mismatch},
			} {
				msg := idem.Message{Key: tc.key, Fingerprint: fp("v1")}
				held := msg
				held.Fingerprint = tc.other
				tx := inOtherTx(t, func(tx pgx.Tx) error {
					res, err := e.s.ProcessTx(ctx, tx, held)
					if err == nil && res != idem.Processed {
						err = fmt.Errorf("held record: %v", res)
					}
					return err
				})
				var res idem.Outcome
				err := whileWaiting(t, waiters, func() error { return tx.Commit(ctx) }, func() error {
					var err error
					res, err = e.Process(ctx, msg, nil)
					return err
				})
				if res != tc.want || (err != nil) != (tc.want == idem.Mismatch) {
					t.Fatalf("%s: Process = %v, %v; want %v", tc.key, res, err, tc.want)
				}
				if n := e.mustEffects(t)[tc.key]; n != 0 {
					t.Fatalf("%s: the handler ran %d times", tc.key, n)
				}
			}
		})
	}
}

func TestProcessInsertsOverRecordDeletedDuringInsert(t *testing.T) {
	t.Parallel()
	e, waiters := newRaceEnv(t, false)
	ctx := ctxT(t)
	old := idem.Message{Key: "k", Fingerprint: fp("v1")}
	if res, err := e.Process(ctx, old, nil); err != nil || res != idem.Processed {
		t.Fatal(res, err)
	}
	// The statement's snapshot still holds the old record, completed with
	// the same content: a Duplicate if it were read, but the insert won.
	tx := inOtherTx(t, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM "+qualified(e.s, "idem_records")+" WHERE key = 'k'")
		return err
	})
	var res idem.Outcome
	err := whileWaiting(t, waiters, func() error { return tx.Commit(ctx) }, func() error {
		var err error
		res, err = e.Process(ctx, old, nil)
		return err
	})
	if err != nil || res != idem.Processed {
		t.Fatalf("Process after the delete = %v, %v; want Processed", res, err)
	}
	if n := e.mustEffects(t)["k"]; n != 2 {
		t.Fatalf("effects = %d, want 2", n)
	}
}

func TestProcessBatchSeesRecordsCommittedDuringInsert(t *testing.T) {
	t.Parallel()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned=%v", partitioned), func(t *testing.T) {
			t.Parallel()
			e, waiters := newRaceEnv(t, partitioned)
			ctx := ctxT(t)
			msg := func(k string) idem.Message { return idem.Message{Key: k, Fingerprint: fp(k)} }
			// a is committed before; b and m are held by another
			// transaction (m for other content); c is new.
			if _, err := e.ProcessBatch(ctx, []idem.Message{msg("a")}, nil); err != nil {
				t.Fatal(err)
			}
			held := msg("m")
			held.Fingerprint = fp("other")
			tx := inOtherTx(t, func(tx pgx.Tx) error {
				_, err := e.s.ProcessBatchTx(ctx, tx, []idem.Message{msg("b"), held})
				return err
			})
			var res []idem.Outcome
			err := whileWaiting(t, waiters, func() error { return tx.Commit(ctx) }, func() error {
				var err error
				res, err = e.ProcessBatch(ctx, []idem.Message{msg("c"), msg("b"), msg("a"), msg("m")}, nil)
				return err
			})
			want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Duplicate, idem.Mismatch}
			if err != nil || !slices.Equal(res, want) {
				t.Fatalf("ProcessBatch = %v, %v; want %v", res, err, want)
			}
			if got := e.mustEffects(t); got["a"] != 1 || got["b"] != 0 || got["c"] != 1 || got["m"] != 0 {
				t.Fatalf("effects = %v; want a and c once", got)
			}
		})
	}
}
