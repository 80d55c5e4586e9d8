package idempgx_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// copyCounter is a pool tracer that counts COPY statements: how
// ProcessBatch's tests tell its COPY path from its INSERT path. It sees
// batches too (doing nothing with them), so the store still pipelines
// BEGIN.
type copyCounter struct{ starts, failed atomic.Int64 }

func (*copyCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (*copyCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (*copyCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (*copyCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*copyCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (c *copyCounter) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	c.starts.Add(1)
	return ctx
}

func (c *copyCounter) TraceCopyFromEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceCopyFromEndData) {
	if d.Err != nil {
		c.failed.Add(1)
	}
}

// copyCounted returns a store over schema on a pool of its own whose COPY
// statements cnt counts.
func copyCounted(tb testing.TB, schema string, cfg idempgx.Config) (*idempgx.Store, *copyCounter) {
	tb.Helper()
	pc, err := pgxpool.ParseConfig(databaseURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	cnt := &copyCounter{}
	pc.ConnConfig.Tracer = cnt
	pc.MaxConns = 16
	p, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	cfg.Schema = schema
	s, err := idempgx.New(p, &cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s, cnt
}

// keyed returns n messages with keys prefix0000… and content of their own.
func keyed(prefix string, n int) []idem.Message {
	msgs := make([]idem.Message, n)
	for i := range msgs {
		k := fmt.Sprintf("%s%04d", prefix, i)
		msgs[i] = idem.Message{Key: k, Fingerprint: fp(k)}
	}
	return msgs
}

// recordRow is what a dedupe record holds, times as offsets from its
// creation.
type recordRow struct {
	State                     string
	Token                     int64
	Fingerprint, Result       []byte
	Failed, Tombstone, Leased bool
	Completed, Expires        time.Duration
}

func readRecord(t *testing.T, s *idempgx.Store, key string) recordRow {
	t.Helper()
	var r recordRow
	err := s.Pool().QueryRow(context.Background(), `SELECT state, token, fingerprint, result, failed, tombstone,
	lease_expires_at IS NOT NULL, completed_at - created_at, expires_at - created_at
FROM `+qualified(s, "idem_records")+` WHERE scope = '' AND key = $1`, key).Scan(
		&r.State, &r.Token, &r.Fingerprint, &r.Result, &r.Failed, &r.Tombstone, &r.Leased, &r.Completed, &r.Expires)
	if err != nil {
		t.Fatalf("read record %q: %v", key, err)
	}
	return r
}

// TestProcessBatchCopy runs a batch of 100 fresh keys with every kind of
// stored record mixed in, through the COPY path that copies at once and
// the one that looks its keys up first. Copying at once meets the stored
// keys, fails, and runs the batch again on the INSERT path; either way the
// outcomes are the INSERT path's, the handler runs once with the fresh
// messages, and every record is the one the INSERT path writes.
func TestProcessBatchCopy(t *testing.T) {
	t.Parallel()
	for _, lookFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("looksFirst=%v", lookFirst), func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			schema := migratedSchema(t)
			s, cnt := copyCounted(t, schema, idempgx.Config{})
			e := newProcessEnvOn(t, s)
			ref, _ := copyCounted(t, schema, idempgx.Config{NoCopy: true})

			for _, m := range []idem.Message{
				{Key: "seen", Fingerprint: fp("s")},
				{Key: "taken", Fingerprint: fp("t")},
				{Key: "old", Fingerprint: fp("o")},
			} {
				if res, err := ref.ProcessBatch(ctx, []idem.Message{m}, func(context.Context, pgx.Tx, []int) error { return nil }); err != nil || res[0] != idem.Processed {
					t.Fatal(res, err)
				}
			}
			if _, err := s.Pool().Exec(ctx, "UPDATE "+qualified(s, "idem_records")+" SET expires_at = now() - interval '1 second' WHERE key = 'old'"); err != nil {
				t.Fatal(err)
			}
			fresh := keyed("c", 100)
			fresh[7].Retention = 90 * time.Minute
			msgs := append([]idem.Message{
				{Key: "seen", Fingerprint: fp("s")},  // Duplicate
				{Key: "taken", Fingerprint: fp("x")}, // Mismatch
				{Key: "old", Fingerprint: fp("O")},   // expired: taken over
			}, fresh...)
			msgs = append(msgs, fresh[3], idem.Message{Key: fresh[4].Key, Fingerprint: fp("other")}) // repeats in the batch
			idempgx.SetCopyLooksFirst(s, lookFirst)

			calls := 0
			res, err := s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, idx []int) error {
				calls++
				keys := make([]string, len(idx))
				for n, i := range idx {
					keys[n] = msgs[i].Key
				}
				_, err := tx.Exec(ctx, "INSERT INTO "+e.effects+" (key) SELECT unnest($1::text[])", keys)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if calls != 1 {
				t.Fatalf("handler ran %d times, want 1", calls)
			}
			want := []idem.Outcome{idem.Duplicate, idem.Mismatch, idem.Processed}
			for range fresh {
				want = append(want, idem.Processed)
			}
			want = append(want, idem.Duplicate, idem.Mismatch)
			if fmt.Sprint(res) != fmt.Sprint(want) {
				t.Fatalf("results %v\nwant    %v", res, want)
			}
			effects := e.mustEffects(t)
			if len(effects) != 101 || effects["old"] != 1 || effects["seen"] != 0 || effects["taken"] != 0 {
				t.Fatalf("%d keys have effects (old %d, seen %d, taken %d), want the 100 fresh and old once",
					len(effects), effects["old"], effects["seen"], effects["taken"])
			}
			for k, n := range effects {
				if n != 1 {
					t.Errorf("key %s has %d effects", k, n)
				}
			}
			// One COPY either way; copying at once met the stored keys.
			wantFailed := int64(1)
			if lookFirst {
				wantFailed = 0
			}
			if cnt.starts.Load() != 1 || cnt.failed.Load() != wantFailed {
				t.Fatalf("%d COPY statements, %d failed; want 1, %d", cnt.starts.Load(), cnt.failed.Load(), wantFailed)
			}
			if !idempgx.CopyLooksFirst(s) {
				t.Error("after a batch that met stored keys, the next does not look first")
			}

			// A copied record is the one the INSERT path writes.
			if _, err := ref.ProcessBatch(ctx, []idem.Message{{Key: "inserted", Fingerprint: fp("c0000"), Retention: 90 * time.Minute}},
				func(context.Context, pgx.Tx, []int) error { return nil }); err != nil {
				t.Fatal(err)
			}
			inserted, copied := readRecord(t, s, "inserted"), readRecord(t, s, fresh[7].Key)
			want0 := fp("c0000")
			copied.Fingerprint = want0[:]
			if fmt.Sprint(copied) != fmt.Sprint(inserted) {
				t.Fatalf("copied record %+v\ninserted      %+v", copied, inserted)
			}
			if inserted.Completed != 0 || inserted.Expires != 90*time.Minute || inserted.Token != 0 || inserted.State != "completed" {
				t.Fatalf("inserted record %+v", inserted)
			}
			if got := readRecord(t, s, fresh[0].Key); got.Expires != idem.DefaultRetention || got.Fingerprint[0] != fresh[0].Fingerprint[0] {
				t.Fatalf("record of %s: %+v, want the default retention %v", fresh[0].Key, got, idem.DefaultRetention)
			}

			// The same batch again: all duplicates or mismatches, no COPY,
			// no handler.
			res, err = s.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []int) error {
				t.Error("handler called without fresh messages")
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r == idem.Processed {
					t.Errorf("message %d (%s) processed twice", i, msgs[i].Key)
				}
			}
			if cnt.starts.Load() != 1 {
				t.Errorf("a batch with nothing to copy ran COPY")
			}
		})
	}
}

// TestProcessBatchCopyWhen: the COPY path takes batches of CopyMinKeys
// distinct keys or more, in the plain layout, unless Config.NoCopy.
func TestProcessBatchCopyWhen(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	// run processes msgs, whose last repeats messages repeat earlier keys.
	run := func(s *idempgx.Store, msgs []idem.Message, repeats int) {
		t.Helper()
		res, err := s.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []int) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			want := idem.Processed
			if i >= len(msgs)-repeats {
				want = idem.Duplicate
			}
			if r != want {
				t.Fatalf("message %d: %v, want %v", i, r, want)
			}
		}
	}
	s, cnt := copyCounted(t, migratedSchema(t), idempgx.Config{})
	small := keyed("s", idempgx.CopyMinKeys)
	// One key short of the threshold, repeats not counted.
	run(s, append(small[:idempgx.CopyMinKeys-1:idempgx.CopyMinKeys-1], small[0], small[1]), 2)
	if n := cnt.starts.Load(); n != 0 {
		t.Fatalf("%d distinct keys ran %d COPY statements, want 0", idempgx.CopyMinKeys-1, n)
	}
	run(s, keyed("t", idempgx.CopyMinKeys), 0)
	if n := cnt.starts.Load(); n != 1 {
		t.Fatalf("%d distinct keys ran %d COPY statements, want 1", idempgx.CopyMinKeys, n)
	}

	off, cnt := copyCounted(t, migratedSchema(t), idempgx.Config{NoCopy: true})
	run(off, keyed("u", 500), 0)
	if n := cnt.starts.Load(); n != 0 {
		t.Fatalf("NoCopy: %d COPY statements", n)
	}

	part := newPartitionedStore(t, nil)
	ps, cnt := copyCounted(t, part.Config().Schema, idempgx.Config{Partitioned: true})
	run(ps, keyed("v", 500), 0)
	if n := cnt.starts.Load(); n != 0 {
		t.Fatalf("partitioned layout: %d COPY statements", n)
	}

	// After a batch that looked its keys up and met one, the next batches
	// look first, until enough of them met none.
	idempgx.SetCopyLooksFirst(s, false)
	seen := keyed("t", 1)
	run(s, keyed("w", 100), 0)
	if idempgx.CopyLooksFirst(s) {
		t.Fatal("a clean batch made the next look first")
	}
	res, err := s.ProcessBatch(ctx, append(keyed("x", 100), seen...), func(context.Context, pgx.Tx, []int) error { return nil })
	if err != nil || res[100] != idem.Duplicate {
		t.Fatal(res, err)
	}
	if !idempgx.CopyLooksFirst(s) {
		t.Fatal("a batch that met a stored key did not make the next look first")
	}
	clean := 0
	for idempgx.CopyLooksFirst(s) {
		clean++
		if clean > 40 {
			t.Fatal("still looking first after 40 clean batches")
		}
		run(s, keyed(fmt.Sprintf("y%02d-", clean), 100), 0)
	}
	if clean < 8 {
		t.Fatalf("looked first for only %d clean batches", clean)
	}
}

// TestProcessBatchCopyHandlerError: on the COPY path too, a failing
// handler rolls the records back.
func TestProcessBatchCopyHandlerError(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, cnt := copyCounted(t, migratedSchema(t), idempgx.Config{})
	e := newProcessEnvOn(t, s)
	msgs := keyed("h", 100)
	boom := errors.New("boom")
	if res, err := e.ProcessBatch(ctx, msgs, boom); !errors.Is(err, boom) || res != nil {
		t.Fatalf("failing batch = %v, %v", res, err)
	}
	if cnt.starts.Load() != 1 || cnt.failed.Load() != 0 {
		t.Fatalf("%d COPY statements, %d failed; want 1, 0", cnt.starts.Load(), cnt.failed.Load())
	}
	var n int
	if err := s.Pool().QueryRow(ctx, "SELECT count(*) FROM "+qualified(s, "idem_records")).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d records after the rollback (%v)", n, err)
	}
	res, err := e.ProcessBatch(ctx, msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != idem.Processed {
			t.Fatalf("redelivery: message %d %v", i, r)
		}
	}
	if got := e.mustEffects(t); len(got) != 100 {
		t.Fatalf("%d effects, want 100", len(got))
	}
}

// TestProcessBatchCopyLiveLease: a key held by a live lease fails the
// batch with ErrInProgress on both COPY paths, and records nothing.
func TestProcessBatchCopyLiveLease(t *testing.T) {
	t.Parallel()
	for _, lookFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("looksFirst=%v", lookFirst), func(t *testing.T) {
			t.Parallel()
			ctx := ctxT(t)
			s, _ := copyCounted(t, migratedSchema(t), idempgx.Config{})
			e := newProcessEnvOn(t, s)
			msgs := keyed("l", 100)
			c, err := s.Claim(ctx, idem.ClaimRequest{Key: msgs[50].Key, Fingerprint: msgs[50].Fingerprint, Lease: time.Minute})
			if err != nil || c.Outcome != idem.Acquired {
				t.Fatal(c, err)
			}
			idempgx.SetCopyLooksFirst(s, lookFirst)
			if res, err := e.ProcessBatch(ctx, msgs, nil); !errors.Is(err, idem.ErrInProgress) || res != nil {
				t.Fatalf("batch over a live lease = %v, %v; want ErrInProgress", res, err)
			}
			var n int
			if err := s.Pool().QueryRow(ctx, "SELECT count(*) FROM "+qualified(s, "idem_records")).Scan(&n); err != nil || n != 1 {
				t.Fatalf("%d records, want the lease's alone (%v)", n, err)
			}
			if len(e.mustEffects(t)) != 0 {
				t.Fatal("effects applied")
			}
		})
	}
}

// TestProcessBatchCopyErrors: a cancelled context and a schema without
// the idem tables fail the batch with their own errors.
func TestProcessBatchCopyErrors(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, _ := copyCounted(t, newSchema(t), idempgx.Config{})
	ok := func(context.Context, pgx.Tx, []int) error { return nil }
	if _, err := s.ProcessBatch(ctx, keyed("m", 100), ok); !errors.Is(err, idempgx.ErrNotMigrated) {
		t.Fatalf("unmigrated schema: %v, want ErrNotMigrated", err)
	}
	idempgx.SetCopyLooksFirst(s, true)
	if _, err := s.ProcessBatch(ctx, keyed("m", 100), ok); !errors.Is(err, idempgx.ErrNotMigrated) {
		t.Fatalf("unmigrated schema, looking first: %v, want ErrNotMigrated", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	s2, _ := copyCounted(t, migratedSchema(t), idempgx.Config{})
	if _, err := s2.ProcessBatch(cancelled, keyed("m", 100), ok); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	var n int
	if err := s2.Pool().QueryRow(ctx, "SELECT count(*) FROM "+qualified(s2, "idem_records")).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d records after a cancelled batch (%v)", n, err)
	}
}

// TestProcessBatchCopyConcurrent: 24 consumers process overlapping
// batches of 100 drawn from 1,500 keys, so that copies meet keys stored by
// each other's batches (unique violations, then the INSERT path) and the
// policy moves between copying at once and looking first. Every key ends
// with exactly one effect.
func TestProcessBatchCopyConcurrent(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, cnt := copyCounted(t, migratedSchema(t), idempgx.Config{})
	e := newProcessEnvOn(t, s)
	const consumers, batches, size, keys = 24, 12, 100, 1500
	all := keyed("k", keys)
	var processed atomic.Int64
	var wg sync.WaitGroup
	for c := range consumers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 7))
			for b := range batches {
				msgs := make([]idem.Message, size)
				base := r.IntN(keys)
				for i := range msgs {
					// Mostly a run of neighbours, so batches overlap.
					msgs[i] = all[(base+i*(1+b%3))%keys]
				}
				res, err := e.ProcessBatch(ctx, msgs, nil)
				if err != nil {
					t.Error(err)
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
	wg.Wait()
	got := e.mustEffects(t)
	for k, n := range got {
		if n != 1 {
			t.Errorf("key %s has %d effects", k, n)
		}
	}
	if int64(len(got)) != processed.Load() {
		t.Fatalf("%d keys have effects, %d messages were reported processed", len(got), processed.Load())
	}
	t.Logf("%d keys processed, %d COPY statements, %d met a stored key", len(got), cnt.starts.Load(), cnt.failed.Load())
	if cnt.starts.Load() == 0 {
		t.Fatal("no batch took the COPY path")
	}
}

// raceCopy processes keyed(prefix, 100) while another transaction holds
// an uncommitted record of its 51st key, which the batch's lookup cannot
// see: its COPY waits for that transaction, which then commits, and the
// COPY fails on the key. The batch must run again on the INSERT path and
// find that key a Duplicate.
func raceCopy(t *testing.T, s *idempgx.Store, prefix string) {
	t.Helper()
	ctx := ctxT(t)
	msgs := keyed(prefix, 100)
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if res, err := s.ProcessBatchTx(ctx, tx, msgs[50:51]); err != nil || res[0] != idem.Processed {
		t.Fatal(res, err)
	}
	var pid int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res   []idem.Outcome
		fresh []int
		calls int
		err   error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.res, r.err = s.ProcessBatch(ctx, msgs, func(_ context.Context, _ pgx.Tx, fresh []int) error {
			r.calls++
			r.fresh = fresh
			return nil
		})
		done <- r
	}()
	// Wait until a backend waits on the holder's transaction.
	for {
		var waiting bool
		err := s.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))`, pid).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the batch ended without waiting for the holder: %v, %v", r.res, r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.calls != 1 || len(r.fresh) != 99 {
		t.Fatalf("handler ran %d times, last with %d messages; want once with 99", r.calls, len(r.fresh))
	}
	for i, o := range r.res {
		want := idem.Processed
		if i == 50 {
			want = idem.Duplicate
		}
		if o != want {
			t.Fatalf("message %d: %v, want %v", i, o, want)
		}
	}
}

// TestProcessBatchCopyRace: a COPY that meets a key committed by a
// concurrent transaction runs the batch again on the INSERT path. Without
// a lookup that makes the next batches look first; after one, batches take
// the INSERT path for a pause that doubles with each such COPY.
func TestProcessBatchCopyRace(t *testing.T) {
	t.Parallel()
	t.Run("looksFirst=false", func(t *testing.T) {
		t.Parallel()
		s, cnt := copyCounted(t, migratedSchema(t), idempgx.Config{})
		idempgx.SetCopyLooksFirst(s, false)
		raceCopy(t, s, "r")
		if cnt.starts.Load() != 1 || cnt.failed.Load() != 1 {
			t.Fatalf("%d COPY statements, %d failed; want 1, 1", cnt.starts.Load(), cnt.failed.Load())
		}
		if until, _ := idempgx.CopyPause(s); !idempgx.CopyLooksFirst(s) || !until.IsZero() {
			t.Fatalf("looks first %v, paused until %v; want true, no pause", idempgx.CopyLooksFirst(s), until)
		}
	})
	t.Run("looksFirst=true", func(t *testing.T) {
		t.Parallel()
		s, cnt := copyCounted(t, migratedSchema(t), idempgx.Config{})
		e := newProcessEnvOn(t, s)
		ctx := ctxT(t)
		batch := func(prefix string) {
			t.Helper()
			if _, err := e.ProcessBatch(ctx, keyed(prefix, 100), nil); err != nil {
				t.Fatal(err)
			}
		}
		// checkPause checks that a race that ended between before and now
		// paused the COPY path for pause, and made the next pause next.
		checkPause := func(before time.Time, pause, next time.Duration) {
			t.Helper()
			until, n := idempgx.CopyPause(s)
			if until.Before(before.Add(pause)) || until.After(time.Now().Add(pause)) || n != next {
				t.Fatalf("paused until %v (%v after the race began), next pause %v; want a pause of %v, next %v",
					until, until.Sub(before), n, pause, next)
			}
		}
		idempgx.SetCopyLooksFirst(s, true)
		before := time.Now()
		raceCopy(t, s, "r")
		if cnt.starts.Load() != 1 || cnt.failed.Load() != 1 {
			t.Fatalf("%d COPY statements, %d failed; want 1, 1", cnt.starts.Load(), cnt.failed.Load())
		}
		checkPause(before, idempgx.CopyPauseMin, 2*idempgx.CopyPauseMin)
		// During a pause (made long, for a slow machine).
		idempgx.SetCopyPauseUntil(s, time.Now().Add(time.Hour))
		batch("p")
		if n := cnt.starts.Load(); n != 1 {
			t.Fatalf("%d COPY statements during the pause", n-1)
		}
		idempgx.SetCopyPauseUntil(s, time.Now())
		batch("q")
		if cnt.starts.Load() != 2 || cnt.failed.Load() != 1 {
			t.Fatalf("after the pause: %d COPY statements, %d failed; want 2, 1", cnt.starts.Load(), cnt.failed.Load())
		}
		// The COPY succeeded: the next pause is the first's again.
		if _, next := idempgx.CopyPause(s); next != idempgx.CopyPauseMin {
			t.Fatalf("next pause after a COPY that succeeded %v, want %v", next, idempgx.CopyPauseMin)
		}
		idempgx.SetCopyLooksFirst(s, true)
		raceCopy(t, s, "s")
		idempgx.SetCopyPauseUntil(s, time.Now())
		idempgx.SetCopyLooksFirst(s, true)
		before = time.Now()
		raceCopy(t, s, "u")
		checkPause(before, 2*idempgx.CopyPauseMin, 4*idempgx.CopyPauseMin)
	})
}
