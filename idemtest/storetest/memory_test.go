package storetest_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/idemtest/storetest"
)

// The memory store is the reference implementation the suite is proven
// against: a failure here is a bug in the suite or in idemtest.
func TestMemoryStoreConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) idem.Store {
		return idemtest.NewMemoryStore(&idemtest.MemoryOptions{MaxResultBytes: 4096})
	}, &storetest.Options{MaxResultBytes: 4096})
}

func TestMemoryStoreConformanceDefaultLimit(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) idem.Store {
		return idemtest.NewMemoryStore(nil)
	}, nil)
}

func TestMemoryProcessConformance(t *testing.T) {
	t.Parallel()
	storetest.RunProcess(t, func(t *testing.T) storetest.ProcessEnv {
		return newMemoryEnv()
	})
}

// memoryEnv is a transactional path in memory: one mutex plays the
// database transaction, and the dedupe records and effects staged during a
// call are applied only if the handler succeeds. It exists to prove
// RunProcess; real stores run the suite against their database.
type memoryEnv struct {
	mu      sync.Mutex
	dedupe  map[[2]string]dedupeRecord
	effects map[string]int
}

type dedupeRecord struct {
	fp      idem.Fingerprint
	expires time.Time
}

func newMemoryEnv() *memoryEnv {
	return &memoryEnv{dedupe: make(map[[2]string]dedupeRecord), effects: make(map[string]int)}
}

func (e *memoryEnv) Process(ctx context.Context, m idem.Message, fail error) (idem.Outcome, error) {
	res, err := e.ProcessBatch(ctx, []idem.Message{m}, fail)
	if err != nil {
		return "", err
	}
	if res[0] == idem.Mismatch {
		return idem.Mismatch, fmt.Errorf("memory env: key %q: %w", m.Key, idem.ErrFingerprintMismatch)
	}
	return res[0], nil
}

func (e *memoryEnv) ProcessBatch(ctx context.Context, msgs []idem.Message, fail error) ([]idem.Outcome, error) {
	for _, m := range msgs {
		if err := m.Validate(); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	staged := make(map[[2]string]dedupeRecord)
	res := make([]idem.Outcome, len(msgs))
	var fresh []idem.Message
	for i, m := range msgs {
		id := [2]string{m.Scope, m.Key}
		r, ok := staged[id]
		if !ok {
			r, ok = e.dedupe[id]
			ok = ok && now.Before(r.expires)
		}
		switch {
		case !ok:
			staged[id] = dedupeRecord{fp: m.Fingerprint, expires: now.Add(m.RetentionOrDefault())}
			fresh = append(fresh, m)
			res[i] = idem.Processed
		case r.fp == m.Fingerprint:
			res[i] = idem.Duplicate
		default:
			res[i] = idem.Mismatch
		}
	}
	if fail != nil {
		return nil, fmt.Errorf("memory env: handler: %w", fail)
	}
	for id, r := range staged {
		e.dedupe[id] = r
	}
	for _, m := range fresh {
		e.effects[m.Key]++
	}
	return res, nil
}

func (e *memoryEnv) Effects(context.Context) (map[string]int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.effects), nil
}

func TestMemoryStoreListConformance(t *testing.T) {
	t.Parallel()
	storetest.RunList(t, func(t *testing.T) idem.Store { return idemtest.NewMemoryStore(nil) }, nil)
}

func TestMemoryStoreStepsConformance(t *testing.T) {
	storetest.RunSteps(t, func(t *testing.T) idem.Store { return idemtest.NewMemoryStore(nil) }, nil)
}
