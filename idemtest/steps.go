package idemtest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// RecordStep implements [idem.StepStore].
func (s *MemoryStore) RecordStep(ctx context.Context, req idem.StepRequest) (idem.StepRecord, error) {
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.StepRecord{}, fmt.Errorf("idemtest: record step: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	r, err := s.held(req.Scope, req.Key, req.Token, now)
	if err != nil {
		return idem.StepRecord{}, err
	}
	id := recordID{req.Scope, req.Key}
	live := s.liveSteps(id, now)
	var st storekit.StepStats
	for _, l := range live {
		st.Count, st.MaxSeq = st.Count+1, max(st.MaxSeq, l.Seq)
		st.Recorded = st.Recorded || l.Name == req.Name
		st.OtherPayload = st.OtherPayload || l.Fingerprint != r.Fingerprint
	}
	rec, err := storekit.NewStep(req, r.Fingerprint[:], st)
	if err != nil {
		return idem.StepRecord{}, err
	}
	rec.Result = bytes.Clone(rec.Result)
	rec.CreatedAt, rec.ExpiresAt = now, now.Add(req.Retention)
	live = append(live, rec)
	for i := range live {
		live[i].ExpiresAt = rec.ExpiresAt
	}
	s.steps[id] = live
	return copyStep(rec), nil
}

// Steps implements [idem.StepStore].
func (s *MemoryStore) Steps(ctx context.Context, scope, key string) ([]idem.StepRecord, error) {
	if err := idem.Validate(scope, key); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("idemtest: steps: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	live := s.liveSteps(recordID{scope, key}, s.clock())
	out := make([]idem.StepRecord, len(live))
	for i, st := range live {
		out[i] = copyStep(st)
	}
	return out, nil
}

// liveSteps returns the steps of id, dropping them first if they expired:
// all steps of one operation share one ExpiresAt.
func (s *MemoryStore) liveSteps(id recordID, now time.Time) []idem.StepRecord {
	live := s.steps[id]
	if len(live) > 0 && !now.Before(live[0].ExpiresAt) {
		delete(s.steps, id)
		return nil
	}
	return slices.Clip(live)
}

// purgeSteps drops every operation's expired steps.
func (s *MemoryStore) purgeSteps() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	for id := range s.steps {
		s.liveSteps(id, now)
	}
}

func copyStep(st idem.StepRecord) idem.StepRecord {
	st.Result = bytes.Clone(st.Result)
	return st
}
