package idempgx_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/store/idempgx"
)

// TestPartitionedMaintainFinishesAnotherDetach: Maintain may run in
// several processes at once. When another one detaches a partition between
// this one's checks and its own DETACH (here: a transaction detaches p0
// while this Maintain waits to read p0, and commits), Maintain finishes
// the job, drops the detached partition and reports it, instead of failing
// with "is not a partition" and leaving the detached table behind.
func TestPartitionedMaintainFinishesAnotherDetach(t *testing.T) {
	s := newPartitionedStore(t, nil)
	ctx := ctxT(t)
	pool := testPool(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	// p0, the table the conversion left, is old and empty: Maintain's to drop.
	if _, err := tx.Exec(ctx, `ALTER TABLE `+qualified(s, "idem_records")+` DETACH PARTITION `+qualified(s, "idem_records_p0")); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rep idempgx.MaintainReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := s.Maintain(ctx, &idempgx.MaintainOptions{LockTimeout: 10 * time.Second})
		done <- result{rep, err}
	}()
	// Until the Maintain waits for p0.
	for {
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE NOT granted AND relation = to_regclass($1))`,
			qualified(s, "idem_records_p0")).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("Maintain ended without waiting for p0: %+v, %v", r.rep, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Maintain: %v", r.err)
	}
	if !slices.Contains(r.rep.Dropped, "idem_records_p0") {
		t.Errorf("report %+v: p0 not among the dropped", r.rep)
	}
	var left bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, qualified(s, "idem_records_p0")).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Error("the detached p0 was left behind")
	}
}

// TestPartitionedMaintainDropsItsDetachedLeftover: a Maintain that stopped
// between its DETACH and its DROP (a context ended, a process killed) left
// a detached partition, no longer listed among the partitions; the next
// Maintain drops it. A partition detached by hand (no mark) is left alone.
func TestPartitionedMaintainDropsItsDetachedLeftover(t *testing.T) {
	for _, marked := range []bool{true, false} {
		s := newPartitionedStore(t, nil)
		ctx := ctxT(t)
		pool := testPool(t)
		p0 := qualified(s, "idem_records_p0")
		if marked {
			// What Maintain does before its detach.
			if _, err := pool.Exec(ctx, `COMMENT ON TABLE `+p0+` IS 'idem: expired partition, being dropped by Maintain'`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, `ALTER TABLE `+qualified(s, "idem_records")+` DETACH PARTITION `+p0+` CONCURRENTLY`); err != nil {
			t.Fatal(err)
		}
		rep, err := s.Maintain(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p0).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists == marked || slices.Contains(rep.Dropped, "idem_records_p0") != marked {
			t.Errorf("marked %v: p0 exists %v after Maintain, report %+v", marked, exists, rep)
		}
	}
}
