package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// newPartitionedStore returns a store over a fresh schema converted to the
// partitioned layout. cfg may be nil.
func newPartitionedStore(tb testing.TB, cfg *idempgx.Config) *idempgx.Store {
	tb.Helper()
	schema := migratedSchema(tb)
	m, err := idempgx.NewMigrator(testPool(tb), &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		tb.Fatal(err)
	}
	if err := m.Partition(context.Background(), &idempgx.PartitionOptions{Interval: time.Hour}); err != nil {
		tb.Fatalf("partition: %v", err)
	}
	c := idempgx.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Schema, c.Partitioned = schema, true
	s, err := idempgx.New(testPool(tb), &c)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Ping(context.Background()); err != nil {
		tb.Fatalf("ping: %v", err)
	}
	return s
}

// rotatingStore moves the writes to a new partition before every claim,
// so that the suite's records are spread over many partitions and every
// operation meets records of older ones.
type rotatingStore struct{ *idempgx.Store }

func (r rotatingStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if _, err := r.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true}); err != nil {
		return idem.Claim{}, err
	}
	return r.Store.Claim(ctx, req)
}

func TestPartitionedConformance(t *testing.T) {
	t.Parallel()
	testPool(t)
	opts := &storetest.Options{MaxResultBytes: conformanceMaxResult, ClockPrecision: time.Microsecond}
	t.Run("Rotating", func(t *testing.T) {
		t.Parallel()
		storetest.Run(t, func(t *testing.T) idem.Store {
			return rotatingStore{newPartitionedStore(t, &idempgx.Config{MaxResultBytes: conformanceMaxResult})}
		}, opts)
	})
	t.Run("Process", func(t *testing.T) {
		t.Parallel()
		storetest.RunProcess(t, func(t *testing.T) storetest.ProcessEnv {
			return newProcessEnvOn(t, newPartitionedStore(t, nil))
		})
	})
	t.Run("List", func(t *testing.T) {
		t.Parallel()
		storetest.RunList(t, func(t *testing.T) idem.Store { return newPartitionedStore(t, nil) }, nil)
	})
}

// TestPartitionedRotationKeepsKeysUnique runs dozens of goroutines that
// Process and ProcessBatch the same keys, with effects that hold their
// transaction open for a while, while another goroutine moves the writes
// to a new partition as fast as it can: every key has exactly one effect,
// whichever partitions its duplicates were written in. (Without the bucket
// lock, writes that straddle a rotation insert a key twice here.)
func TestPartitionedRotationKeepsKeysUnique(t *testing.T) {
	t.Parallel()
	s := newPartitionedStore(t, nil)
	effects := qualified(s, "effects")
	ctx := ctxT(t)
	if _, err := s.Pool().Exec(ctx, "CREATE TABLE "+effects+" (key text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	const (
		keys    = 20
		workers = 24
		rounds  = 12
	)
	effect := func(ctx context.Context, tx pgx.Tx, ks []string) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" (key) SELECT unnest($1::text[])", ks); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond) // a rotation may come now
		return nil
	}
	stop := make(chan struct{})
	var rotations atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			rep, err := s.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true})
			if err != nil {
				t.Errorf("maintain: %v", err)
				return
			}
			if rep.Rotated {
				rotations.Add(1)
			}
		}
	})
	var processed atomic.Int64
	var workersWG sync.WaitGroup
	for w := range workers {
		workersWG.Go(func() {
			for r := range rounds {
				if (w+r)%2 == 0 {
					for k := range keys {
						msg := idem.Message{Scope: "rot", Key: fmt.Sprintf("r%02d-k%02d", r, (k+w)%keys), Fingerprint: idem.Fingerprint{1}}
						res, err := s.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
							return effect(ctx, tx, []string{msg.Key})
						})
						if err != nil {
							t.Errorf("process: %v", err)
							return
						}
						if res == idem.Processed {
							processed.Add(1)
						}
					}
					continue
				}
				msgs := make([]idem.Message, keys)
				for k := range msgs {
					msgs[k] = idem.Message{Scope: "rot", Key: fmt.Sprintf("r%02d-k%02d", r, k), Fingerprint: idem.Fingerprint{1}}
				}
				res, err := s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
					ks := make([]string, len(fresh))
					for n, i := range fresh {
						ks[n] = msgs[i].Key
					}
					return effect(ctx, tx, ks)
				})
				if err != nil {
					t.Errorf("process batch: %v", err)
					return
				}
				for _, o := range res {
					if o == idem.Processed {
						processed.Add(1)
					}
				}
			}
		})
	}
	workersWG.Wait()
	close(stop)
	wg.Wait()
	counts := map[string]int{}
	rows, err := s.Pool().Query(ctx, "SELECT key, count(*) FROM "+effects+" GROUP BY key")
	if err != nil {
		t.Fatal(err)
	}
	var (
		key string
		n   int
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { counts[key] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(counts) != keys*rounds || processed.Load() != keys*rounds {
		t.Errorf("%d keys with effects, %d Processed, want %d", len(counts), processed.Load(), keys*rounds)
	}
	for k, n := range counts {
		if n != 1 {
			t.Errorf("key %s: %d effects, want 1", k, n)
		}
	}
	if rotations.Load() < 2 {
		t.Fatalf("only %d rotations during the run: the test did not exercise them", rotations.Load())
	}
	t.Logf("%d rotations", rotations.Load())
}

// TestPartitionedMaintainDropsExpired: a partition is dropped only once
// every record in it expired, tokens keep increasing across the drop, and
// a record left in an old partition is still a duplicate, or taken over
// once it expired.
func TestPartitionedMaintainDropsExpired(t *testing.T) {
	t.Parallel()
	s := newPartitionedStore(t, nil)
	ctx := ctxT(t)
	short := idem.Message{Scope: "ret", Key: "short", Fingerprint: idem.Fingerprint{1}, Retention: 300 * time.Millisecond}
	long := idem.Message{Scope: "ret", Key: "long", Fingerprint: idem.Fingerprint{2}, Retention: time.Hour}
	noop := func(context.Context, pgx.Tx) error { return nil }
	for _, m := range []idem.Message{short, long} {
		if res, err := s.Process(ctx, m, noop); err != nil || res != idem.Processed {
			t.Fatalf("process %s: %v %v", m.Key, res, err)
		}
	}
	lease := idem.ClaimRequest{Scope: "ret", Key: "lease", Fingerprint: idem.Fingerprint{3}, Lease: 200 * time.Millisecond}
	first, err := s.Claim(ctx, lease)
	if err != nil || first.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v %v", first, err)
	}
	// Partition 1 holds the three records; the writes move to 2.
	rep, err := s.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true})
	if err != nil || !rep.Rotated || rep.Current != 2 {
		t.Fatalf("maintain: %+v %v", rep, err)
	}
	// p0 (the plain table's rows) was empty: dropped; p1 holds live records.
	if len(rep.Dropped) != 1 || rep.Dropped[0] != "idem_records_p0" || len(rep.Kept) != 1 || rep.Kept[0] != "idem_records_p1" {
		t.Fatalf("dropped %v kept %v, want p0 dropped and p1 kept", rep.Dropped, rep.Kept)
	}
	// A duplicate of a record in the old partition is a duplicate.
	if res, err := s.Process(ctx, long, noop); err != nil || res != idem.Duplicate {
		t.Fatalf("duplicate across partitions: %v %v", res, err)
	}
	time.Sleep(400 * time.Millisecond)
	// The expired record and lease are taken over into partition 2.
	if res, err := s.Process(ctx, short, noop); err != nil || res != idem.Processed {
		t.Fatalf("expired record across partitions: %v %v", res, err)
	}
	second, err := s.Claim(ctx, lease)
	if err != nil || second.Outcome != idem.Acquired || !second.Takeover || second.Token <= first.Token {
		t.Fatalf("takeover across partitions: %+v %v (first token %d)", second, err, first.Token)
	}
	// The old holder is fenced off.
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "ret", Key: "lease", Token: first.Token, Retention: time.Minute}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stale complete: %v", err)
	}
	// p1 still holds "long" (an hour of retention): kept. Make it expire.
	rep, err = s.Maintain(ctx, nil)
	if err != nil || len(rep.Dropped) != 0 || len(rep.Kept) != 1 || rep.Rotated {
		t.Fatalf("maintain: %+v %v, want p1 kept and no rotation (the interval is an hour)", rep, err)
	}
	if _, err := s.Pool().Exec(ctx, "UPDATE "+qualified(s, "idem_records")+" SET expires_at = now() WHERE key = 'long'"); err != nil {
		t.Fatal(err)
	}
	rep, err = s.Maintain(ctx, nil)
	if err != nil || len(rep.Dropped) != 1 || rep.Dropped[0] != "idem_records_p1" || len(rep.Kept) != 0 {
		t.Fatalf("maintain: %+v %v, want p1 dropped", rep, err)
	}
	parts, err := s.Partitions(ctx)
	if err != nil || len(parts) != 1 || parts[0].Bucket != 2 || !parts[0].Current {
		t.Fatalf("partitions: %+v %v, want only the current p2", parts, err)
	}
	// Tokens keep increasing after the drop.
	third, err := s.Claim(ctx, idem.ClaimRequest{Scope: "ret", Key: "long", Fingerprint: idem.Fingerprint{2}, Lease: time.Minute})
	if err != nil || third.Outcome != idem.Acquired || third.Token <= second.Token {
		t.Fatalf("claim after drop: %+v %v (previous token %d)", third, err, second.Token)
	}
	// Purge still works in this layout, across partitions.
	if _, err := s.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool().Exec(ctx, "UPDATE "+qualified(s, "idem_records")+" SET expires_at = now()"); err != nil {
		t.Fatal(err)
	}
	n, err := s.Purge(ctx, 1)
	if err != nil || n != 3 {
		t.Fatalf("purge: %d %v, want 3", n, err)
	}
}

func TestPartitionedErrors(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	plain := newStore(t, nil)
	if _, err := plain.Maintain(ctx, nil); !errors.Is(err, idempgx.ErrNotPartitioned) {
		t.Fatalf("maintain on the plain layout: %v", err)
	}
	if _, err := plain.Partitions(ctx); !errors.Is(err, idempgx.ErrNotPartitioned) {
		t.Fatalf("partitions on the plain layout: %v", err)
	}
	// Config.Partitioned on a plain schema, and the reverse: Ping says so.
	wrong, err := idempgx.New(testPool(t), &idempgx.Config{Schema: plain.Config().Schema, Partitioned: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := wrong.Ping(ctx); !errors.Is(err, idempgx.ErrNotPartitioned) {
		t.Fatalf("ping partitioned config on a plain schema: %v", err)
	}
	part := newPartitionedStore(t, nil)
	wrong, err = idempgx.New(testPool(t), &idempgx.Config{Schema: part.Config().Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := wrong.Ping(ctx); !errors.Is(err, idempgx.ErrNotPartitioned) {
		t.Fatalf("ping plain config on a partitioned schema: %v", err)
	}
	m, err := idempgx.NewMigrator(testPool(t), &idempgx.MigratorConfig{Schema: part.Config().Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Partition(ctx, nil); err == nil {
		t.Fatal("partitioning twice succeeded")
	}
	if err := m.Partition(ctx, &idempgx.PartitionOptions{Interval: time.Millisecond}); err == nil {
		t.Fatal("an interval under a second was accepted")
	}
	// migrate down then up gives the plain table again, which converts again.
	if _, err := m.Down(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Partition(ctx, nil); err != nil {
		t.Fatalf("partition after down and up: %v", err)
	}
	empty, err := idempgx.NewMigrator(testPool(t), &idempgx.MigratorConfig{Schema: newSchema(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := empty.Partition(ctx, nil); !errors.Is(err, idempgx.ErrNotMigrated) {
		t.Fatalf("partition an unmigrated schema: %v", err)
	}
}

// TestPartitionedDropDuringTakeovers: while Maintain drops a partition of
// expired records, dozens of goroutines take those same keys over into the
// current partition. No call fails (no deadlock between the drop's locks
// and the takeovers'), and every key is processed again exactly once.
func TestPartitionedDropDuringTakeovers(t *testing.T) {
	t.Parallel()
	s := newPartitionedStore(t, nil)
	ctx := ctxT(t)
	const keys = 60
	msg := func(k int, retention time.Duration) idem.Message {
		return idem.Message{Scope: "drop", Key: fmt.Sprintf("k%02d", k), Fingerprint: idem.Fingerprint{1}, Retention: retention}
	}
	noop := func(context.Context, pgx.Tx) error { return nil }
	for k := range keys {
		if _, err := s.Process(ctx, msg(k, 200*time.Millisecond), noop); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true, KeepExpired: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	var (
		processed atomic.Int64
		dropped   atomic.Int64
		wg        sync.WaitGroup
	)
	wg.Go(func() {
		for range 20 {
			rep, err := s.Maintain(ctx, nil)
			if err != nil {
				t.Errorf("maintain: %v", err)
				return
			}
			dropped.Add(int64(len(rep.Dropped)))
		}
	})
	for w := range 16 {
		wg.Go(func() {
			for k := range keys {
				res, err := s.Process(ctx, msg((k+w*7)%keys, time.Hour), noop)
				if err != nil {
					t.Errorf("process: %v", err)
					return
				}
				if res == idem.Processed {
					processed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if processed.Load() != keys {
		t.Fatalf("%d Processed, want %d (one per expired key)", processed.Load(), keys)
	}
	t.Logf("partitions dropped during the takeovers: %d", dropped.Load())
}

// TestPartitionedDropAbandonedLease: an expired lease nobody took over
// does not pin its partition: Maintain deletes it, as Purge would, and
// drops the partition; its holder is then fenced off. A live lease keeps
// its partition.
func TestPartitionedDropAbandonedLease(t *testing.T) {
	t.Parallel()
	s := newPartitionedStore(t, nil)
	ctx := ctxT(t)
	short, err := s.Claim(ctx, idem.ClaimRequest{Scope: "lease", Key: "abandoned", Fingerprint: idem.Fingerprint{1}, Lease: time.Second})
	if err != nil || short.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v %v", short, err)
	}
	zero, err := s.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true})
	if err != nil {
		t.Fatal(err)
	}
	live, err := s.Claim(ctx, idem.ClaimRequest{Scope: "lease", Key: "live", Fingerprint: idem.Fingerprint{2}, Lease: time.Hour})
	if err != nil || live.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v %v", live, err)
	}
	// On a slow machine the short lease may already have expired here.
	first, err := s.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond)
	rep, err := s.Maintain(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var dropped []string
	for _, d := range append(append(zero.Dropped, first.Dropped...), rep.Dropped...) {
		if d != "idem_records_p0" { // the empty plain table
			dropped = append(dropped, d)
		}
	}
	if len(dropped) != 1 || dropped[0] != "idem_records_p1" || len(rep.Kept) != 1 || rep.Kept[0] != "idem_records_p2" {
		t.Fatalf("maintain: %+v then %+v, want p1 (the abandoned lease) dropped and p2 (the live one) kept", first, rep)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "lease", Key: "abandoned", Token: short.Token, Retention: time.Minute}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete of the dropped lease: %v", err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "lease", Key: "live", Token: live.Token, Retention: time.Minute}); err != nil {
		t.Fatalf("complete of the live lease in an old partition: %v", err)
	}
}
