package idemtest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// MemoryOptions configure a [MemoryStore]. The zero value (or nil) gives
// the defaults.
type MemoryOptions struct {
	// MaxResultBytes is the largest result kept; a larger one turns the
	// record into a tombstone. Zero means idem.DefaultMaxResultBytes.
	MaxResultBytes int
	// Now is the store's clock. Nil means time.Now. Tests that need to move
	// time pass a [Clock]'s Now.
	Now func() time.Time
}

// MemoryStore is an [idem.Store] that keeps its records in process memory.
// It is for unit tests only: every record is lost when the process exits,
// which is exactly the failure idem exists to prevent, so [MemoryStore.Durable]
// reports false and durable components refuse it.
//
// All methods are safe for concurrent use; one mutex serialises them, which
// is fine for tests and would be a bottleneck anywhere else.
type MemoryStore struct {
	now       func() time.Time
	maxResult int

	mu      sync.Mutex
	records map[recordID]*idem.Record
	// steps are the recorded steps per operation, in Seq order (steps.go).
	steps map[recordID][]idem.StepRecord
	// lastToken is global rather than per key: a counter that never goes
	// back makes tokens strictly increase per key even after Release,
	// Delete and Purge forget the record.
	lastToken int64
}

// recordID is a struct, not a joined string, so that no choice of
// delimiters in scope or key can make two records collide.
type recordID struct{ scope, key string }

var (
	_ idem.Store     = (*MemoryStore)(nil)
	_ idem.Durable   = (*MemoryStore)(nil)
	_ idem.Lister    = (*MemoryStore)(nil)
	_ idem.StepStore = (*MemoryStore)(nil)
)

// NewMemoryStore returns an empty in-memory store. opts may be nil.
func NewMemoryStore(opts *MemoryOptions) *MemoryStore {
	s := &MemoryStore{
		now:       time.Now,
		maxResult: idem.DefaultMaxResultBytes,
		records:   make(map[recordID]*idem.Record),
		steps:     make(map[recordID][]idem.StepRecord),
	}
	if opts != nil {
		if opts.Now != nil {
			s.now = opts.Now
		}
		if opts.MaxResultBytes > 0 {
			s.maxResult = opts.MaxResultBytes
		}
	}
	return s
}

// Durable reports false: a memory store loses every record on restart.
func (s *MemoryStore) Durable() bool { return false }

// clock returns the store's time without a monotonic reading, so that
// times handed out compare with == the way times read back from a
// database do.
func (s *MemoryStore) clock() time.Time { return s.now().Round(0) }

func (s *MemoryStore) nextToken() int64 {
	s.lastToken++
	return s.lastToken
}

// live returns the record for id, dropping it first if it is a completed
// record whose retention has passed: such a record counts as absent.
func (s *MemoryStore) live(id recordID, now time.Time) *idem.Record {
	r := s.records[id]
	if r != nil && r.State == idem.StateCompleted && !now.Before(r.ExpiresAt) {
		delete(s.records, id)
		return nil
	}
	return r
}

// Claim implements [idem.Store].
func (s *MemoryStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Claim{}, fmt.Errorf("idemtest: claim: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	id := recordID{req.Scope, req.Key}
	r := s.live(id, now)
	switch {
	case r == nil:
		r = &idem.Record{
			Scope:       req.Scope,
			Key:         req.Key,
			State:       idem.StateInProgress,
			Fingerprint: req.Fingerprint,
			CreatedAt:   now,
		}
		s.records[id] = r
	case r.Fingerprint != req.Fingerprint:
		return idem.Claim{Outcome: idem.Mismatch, Record: copyRecord(r)}, nil
	case r.State == idem.StateCompleted:
		return idem.Claim{Outcome: idem.Completed, Record: copyRecord(r)}, nil
	case now.Before(r.LeaseExpiresAt):
		return idem.Claim{Outcome: idem.InProgress, Record: copyRecord(r)}, nil
	}
	takeover := r.Token != 0
	r.Token = s.nextToken()
	r.LeaseExpiresAt = now.Add(req.Lease)
	return idem.Claim{
		Outcome:        idem.Acquired,
		Token:          r.Token,
		Takeover:       takeover,
		LeaseExpiresAt: r.LeaseExpiresAt,
	}, nil
}

// held returns the in-progress record whose current token is token, or an
// error wrapping idem.ErrLeaseLost.
func (s *MemoryStore) held(scope, key string, token int64, now time.Time) (*idem.Record, error) {
	r := s.live(recordID{scope, key}, now)
	if r == nil || r.State != idem.StateInProgress || r.Token != token {
		return nil, fmt.Errorf("%w: token %d is not the current lease on key %q", idem.ErrLeaseLost, token, key)
	}
	return r, nil
}

// Complete implements [idem.Store]. A result larger than MaxResultBytes is
// dropped and the record becomes a tombstone.
func (s *MemoryStore) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if err := idem.ValidateComplete(req); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemtest: complete: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	r, err := s.held(req.Scope, req.Key, req.Token, now)
	if err != nil {
		return err
	}
	r.State = idem.StateCompleted
	r.Failed = req.Failed
	r.Tombstone = len(req.Result) > s.maxResult
	r.Result = nil
	if !r.Tombstone {
		r.Result = bytes.Clone(req.Result)
		if r.Result == nil {
			r.Result = []byte{}
		}
	}
	r.LeaseExpiresAt = time.Time{}
	r.CompletedAt = now
	r.ExpiresAt = now.Add(req.Retention)
	return nil
}

// Release implements [idem.Store]: the record is forgotten, so the next
// claim starts afresh (Takeover false) with a newer token.
func (s *MemoryStore) Release(ctx context.Context, scope, key string, token int64) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemtest: release: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.held(scope, key, token, s.clock()); err != nil {
		return err
	}
	delete(s.records, recordID{scope, key})
	return nil
}

// Extend implements [idem.Store].
func (s *MemoryStore) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	if err := idem.Validate(scope, key); err != nil {
		return time.Time{}, err
	}
	if lease <= 0 {
		return time.Time{}, fmt.Errorf("%w: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, fmt.Errorf("idemtest: extend: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	r, err := s.held(scope, key, token, now)
	if err != nil {
		return time.Time{}, err
	}
	r.LeaseExpiresAt = now.Add(lease)
	return r.LeaseExpiresAt, nil
}

// Get implements [idem.Store]. Like a database store, it returns expired
// records that have not been purged as they are.
func (s *MemoryStore) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := idem.Validate(scope, key); err != nil {
		return idem.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Record{}, fmt.Errorf("idemtest: get: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.records[recordID{scope, key}]
	if r == nil {
		return idem.Record{}, fmt.Errorf("%w: key %q in scope %q", idem.ErrNotFound, key, scope)
	}
	return *copyRecord(r), nil
}

// Delete implements [idem.Store].
func (s *MemoryStore) Delete(ctx context.Context, scope, key string) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idemtest: delete: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := recordID{scope, key}
	if s.records[id] == nil && s.steps[id] == nil {
		return fmt.Errorf("%w: key %q in scope %q", idem.ErrNotFound, key, scope)
	}
	delete(s.records, id)
	delete(s.steps, id) // a record's steps go with it (also those a Release left)
	return nil
}

// Purge implements [idem.Store]. It removes completed records whose
// retention has passed, at most limit per lock hold (0 means no limit), so
// that a large purge lets other callers in between batches. Records in
// progress are never purged, whatever their lease.
func (s *MemoryStore) Purge(ctx context.Context, limit int) (int64, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: purge limit must not be negative, got %d", idem.ErrInvalidConfig, limit)
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("idemtest: purge: %w", err)
		}
		n := s.purgeBatch(limit)
		total += int64(n)
		if n == 0 || limit == 0 || n < limit {
			s.purgeSteps()
		}
		if limit == 0 || n < limit {
			return total, nil
		}
	}
}

func (s *MemoryStore) purgeBatch(limit int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	n := 0
	for id, r := range s.records {
		if limit > 0 && n == limit {
			break
		}
		if r.State == idem.StateCompleted && !now.Before(r.ExpiresAt) {
			delete(s.records, id)
			n++
		}
	}
	return n
}

// copyRecord returns a copy that shares no memory with the stored record,
// so callers cannot change the store through a returned result.
func copyRecord(r *idem.Record) *idem.Record {
	c := *r
	c.Result = bytes.Clone(r.Result)
	return &c
}

// List implements [idem.Lister], in (scope, key) order by bytes.
func (s *MemoryStore) List(ctx context.Context, req idem.ListRequest) (idem.ListPage, error) {
	return storekit.ListOrdered(ctx, req, s.readAfter)
}

func (s *MemoryStore) readAfter(ctx context.Context, pos storekit.Position, scope string, n int) ([]idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("idemtest: list: %w", err)
	}
	after := func(id recordID) bool {
		if c := strings.Compare(id.scope, pos.Scope); c != 0 {
			return c > 0
		}
		return id.key > pos.Key
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []recordID
	for id := range s.records {
		if after(id) && (scope == "" || id.scope == scope) {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b recordID) int {
		if c := strings.Compare(a.scope, b.scope); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	out := make([]idem.Record, 0, min(n, len(ids)))
	for _, id := range ids[:min(n, len(ids))] {
		r := *s.records[id]
		r.Result = nil
		out = append(out, r)
	}
	return out, nil
}
