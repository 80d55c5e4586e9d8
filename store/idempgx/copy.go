package idempgx

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// ProcessBatch's COPY path (plain layout, batches of at least copyMinKeys
// distinct keys).
//
// The INSERT … SELECT unnest … ON CONFLICT DO NOTHING of a batch's records
// runs the executor row by row; COPY FROM STDIN in binary writes the same
// rows with the heap's multi-insert, about a third less server time per
// row (see docs/bench/round2-notes.md, "sixth day"). COPY has no ON
// CONFLICT, so the path runs only where the unique key cannot be met, or
// almost never:
//
//   - When recent batches met no stored key, the batch is copied without
//     looking first (optimistic). When they did, its keys are looked up
//     first (processLookup, an index probe per key, pipelined with BEGIN)
//     and only the absent ones are copied; the found ones are settled as
//     Duplicate or Mismatch as on the INSERT path, and those to take over
//     (an expired record) go through the INSERT statement that takes over.
//   - A key that a concurrent batch stored meanwhile fails the COPY with a
//     unique violation (23505), which aborts the transaction before the
//     handler ran: the batch then rolls back and runs again, whole, on the
//     INSERT path, in a new transaction. The primary key decides, as it
//     does for the INSERT path; nothing is judged from a stale read.
//
// The records' times are the transaction's now(), read in the round trip
// that carries BEGIN, so a copied record holds what the INSERT would have
// written (created_at = completed_at = now(), expires_at = now() +
// retention, token 0). ProcessBatchTx, in a transaction of the caller's,
// keeps the INSERT path: a failed COPY would abort the caller's work too.
// The partitioned layout keeps it as well: uniqueness across its
// partitions is checked by the INSERT statement itself (see partition.go).

// copyMinKeys is the fewest distinct keys a batch copies. Below it the
// round trips COPY adds (the now() read, the COPY's own handshake) cost
// more than the rows save: break-even measured at 30–60 rows.
const copyMinKeys = 64

// recordCopyColumns are the columns a copied record sets; the others take
// their defaults (result NULL, failed and tombstone false, no lease).
var recordCopyColumns = []string{"scope", "key", "state", "fingerprint", "token", "created_at", "completed_at", "expires_at"}

// errCopyMet says the COPY met a stored key: the batch goes again on the
// INSERT path.
var errCopyMet = errors.New("idempgx: a copied key was stored concurrently")

// copyPolicy decides whether a batch takes the COPY path, and whether it
// looks its keys up first, from what recent batches met.
//
// seen rises to copySeenMax when a batch meets a stored key (found by the
// lookup, or by a failed COPY) and decays by an eighth per batch that
// meets none; a batch looks first while it is above copySeenLookup: about
// 16 clean batches after the last one that met a key.
//
// A COPY after a lookup that meets a key stored concurrently (one the
// lookup could not see: its transaction had not committed) costs the
// batch a second run. Concurrent consumers that often get the same keys at
// the same time would pay that on every batch, so after such a COPY the
// batches take the INSERT path for a pause: copyPauseMin, doubled by each
// such COPY up to copyPauseMax, and back to copyPauseMin after a COPY that
// succeeded. A pause in time, not in batches, ends as soon after such
// consumers stop racing however many batches the store runs.
type copyPolicy struct {
	seen atomic.Int32
	// until is when the pause ends (Unix nanoseconds); pause is the next
	// pause.
	until, pause atomic.Int64
}

const (
	copySeenMax    = 1 << 10
	copySeenLookup = copySeenMax / 8
	copyPauseMin   = 100 * time.Millisecond
	copyPauseMax   = time.Second
)

func (p *copyPolicy) lookupFirst() bool { return p.seen.Load() > copySeenLookup }

func (p *copyPolicy) observe(met bool) {
	for {
		old := p.seen.Load()
		next := old - old/8
		if met {
			next = copySeenMax
		}
		if old == next || p.seen.CompareAndSwap(old, next) {
			return
		}
	}
}

// take reports whether an eligible batch copies: not during a pause.
func (p *copyPolicy) take() bool {
	until := p.until.Load()
	return until == 0 || time.Now().UnixNano() >= until
}

// raced records a COPY after a lookup that met a key stored concurrently.
func (p *copyPolicy) raced() {
	p.observe(true)
	pause := max(time.Duration(p.pause.Load()), copyPauseMin)
	p.until.Store(time.Now().Add(pause).UnixNano())
	p.pause.Store(int64(min(2*pause, copyPauseMax)))
}

// copied records a COPY that succeeded.
func (p *copyPolicy) copied() {
	if p.pause.Load() != int64(copyPauseMin) {
		p.pause.Store(int64(copyPauseMin))
	}
}

// copyEligible reports whether a batch of n distinct keys takes the COPY
// path.
func (s *Store) copyEligible(n int) bool {
	return !s.cfg.NoCopy && !s.cfg.Partitioned && n >= copyMinKeys && s.copy.take()
}

// processBatchCopy is ProcessBatch on the COPY path. It returns errCopyMet,
// with nothing written and fn not called, when the batch must go again on
// the INSERT path.
func (s *Store) processBatchCopy(ctx context.Context, msgs []idem.Message, first, pending []int, fn func(ctx context.Context, tx pgx.Tx, fresh []int) error) ([]idem.Outcome, error) {
	var results []idem.Outcome
	lookFirst := s.copy.lookupFirst()
	err := s.inTx(ctx, "process batch", func(tx pgx.Tx) (bool, error) {
		results = make([]idem.Outcome, len(msgs))
		stored := make(map[int]storekit.Existing)
		now, absent, retry, err := s.copyStart(ctx, tx, msgs, pending, lookFirst, results, stored)
		if err != nil {
			return false, err
		}
		if lookFirst && len(absent) < copyMinKeys {
			// Too few to be worth a COPY: the INSERT takes them.
			absent, retry = nil, inOrder(pending, absent, retry)
		}
		if len(absent) > 0 {
			if err := s.copyRecords(ctx, tx, msgs, absent, now, lookFirst); err != nil {
				return false, err
			}
			for _, i := range absent {
				results[i] = idem.Processed
			}
		}
		if !lookFirst {
			s.copy.observe(false)
		}
		// Records to take over, then the later occurrences of each key.
		if err := s.settleBatch(ctx, tx, msgs, first, retry, 1, results, stored); err != nil {
			return false, err
		}
		return runBatchHandler(ctx, tx, results, fn)
	})
	if err != nil {
		return nil, err
	}
	return results, nil
}

// copyStart sends BEGIN with the read of the transaction's now() and, when
// lookFirst, the lookup of msgs[pending...]. It returns now, the messages
// to copy and, after a lookup, those whose record is to be taken over,
// having settled the duplicates and mismatches into results and stored.
func (s *Store) copyStart(ctx context.Context, tx pgx.Tx, msgs []idem.Message, pending []int, lookFirst bool, results []idem.Outcome, stored map[int]storekit.Existing) (now time.Time, absent, retry []int, err error) {
	if !lookFirst {
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
			return now, nil, nil, s.wrap("process batch", err)
		}
		return now, pending, nil, nil
	}
	found, err := s.nowAndLookup(ctx, tx, msgs, pending, &now)
	if err != nil {
		return now, nil, nil, err
	}
	s.copy.observe(len(found) > 0)
	known := make([]int, 0, len(found))
	absent = make([]int, 0, len(pending)-len(found))
	for _, i := range pending {
		if _, ok := found[recordRef{msgs[i].Scope, msgs[i].Key}]; ok {
			known = append(known, i)
		} else {
			absent = append(absent, i)
		}
	}
	retry, err = judgeFound(msgs, known, found, results, stored)
	return now, absent, retry, err
}

// nowAndLookup reads the transaction's now() into now and looks up the
// records of msgs[idx...], both in one round trip (a pgx batch). A lookup
// planned on every call (planLookup, which a batch cannot ask for) goes in
// a round trip of its own.
func (s *Store) nowAndLookup(ctx context.Context, tx pgx.Tx, msgs []idem.Message, idx []int, now *time.Time) (map[recordRef]storekit.Existing, error) {
	if s.q.planLookup {
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(now); err != nil {
			return nil, s.wrap("process batch", err)
		}
		return s.lookup(ctx, tx, msgs, idx)
	}
	b := &pgx.Batch{}
	b.Queue("SELECT now()")
	b.Queue(s.q.processLookup, s.lookupArgs(msgs, idx)...)
	br := tx.SendBatch(ctx, b)
	found, err := func() (map[recordRef]storekit.Existing, error) {
		if err := br.QueryRow().Scan(now); err != nil {
			return nil, s.wrap("process batch", err)
		}
		rows, err := br.Query()
		if err != nil {
			return nil, s.wrap("process batch", err)
		}
		return s.scanLookup(rows, len(idx))
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = s.wrap("process batch", cerr)
	}
	return found, err
}

// copyRecords writes the completed records of msgs[idx...] with COPY, as
// of the transaction's now. A stored key returns errCopyMet: one stored
// concurrently if the batch looked its keys up first (looked).
func (s *Store) copyRecords(ctx context.Context, tx pgx.Tx, msgs []idem.Message, idx []int, now time.Time, looked bool) error {
	rows := make([][]any, len(idx))
	vals := make([]any, 8*len(idx)) // one allocation for every row's values
	for n, i := range idx {
		m := &msgs[i]
		exp := now.Add(time.Duration(micros(m.RetentionOrDefault())) * time.Microsecond)
		row := vals[8*n : 8*n+8 : 8*n+8]
		row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7] =
			m.Scope, m.Key, string(idem.StateCompleted), m.Fingerprint[:], int64(0), now, now, exp
		rows[n] = row
	}
	copied, err := tx.CopyFrom(ctx, pgx.Identifier{s.schema, "idem_records"}, recordCopyColumns, pgx.CopyFromRows(rows))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
		if looked {
			s.copy.raced()
		} else {
			s.copy.observe(true)
		}
		return errCopyMet
	}
	if err != nil {
		return s.wrap("process batch: copy", err)
	}
	if copied != int64(len(idx)) {
		return fmt.Errorf("idempgx: process batch: copy wrote %d records of %d", copied, len(idx))
	}
	s.copy.copied()
	return nil
}

// inOrder returns the elements of a and b, two subsequences of seq, in
// seq's order.
func inOrder(seq, a, b []int) []int {
	in := make(map[int]bool, len(a)+len(b))
	for _, i := range a {
		in[i] = true
	}
	for _, i := range b {
		in[i] = true
	}
	out := make([]int, 0, len(in))
	for _, i := range seq {
		if in[i] {
			out = append(out, i)
		}
	}
	return out
}

// runBatchHandler calls fn with the fresh messages of a settled batch and
// says whether to commit: not when there are none (nothing was written).
func runBatchHandler(ctx context.Context, tx pgx.Tx, results []idem.Outcome, fn func(ctx context.Context, tx pgx.Tx, fresh []int) error) (bool, error) {
	fresh := make([]int, 0, len(results))
	for i, r := range results {
		if r == idem.Processed {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return false, nil
	}
	if err := fn(ctx, tx, fresh); err != nil {
		return false, fmt.Errorf("idempgx: process batch: handler: %w", classify(err))
	}
	return true, nil
}
