package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/idem-go/idem"
)

// Stream is one run's deliveries: Keys in delivery order, where a share of
// them (the duplicate percentage) repeat an earlier key, as redeliveries do.
type Stream struct {
	Keys []string
	// Distinct is how many different keys Keys holds: the number of effects
	// an exactly-once consumer must apply.
	Distinct int
}

// NewStream returns n deliveries whose keys start with prefix and of which
// about dupPercent% repeat an earlier delivery. It is deterministic for a
// given seed.
func NewStream(prefix string, n, dupPercent int, seed uint64) Stream {
	r := rand.New(rand.NewPCG(seed, 0x1de))
	keys := make([]string, n)
	distinct := 0
	for i := range keys {
		if i > 0 && r.IntN(100) < dupPercent {
			keys[i] = keys[r.IntN(i)]
			continue
		}
		keys[i] = fmt.Sprintf("%s-%06d", prefix, distinct)
		distinct++
	}
	return Stream{Keys: keys, Distinct: distinct}
}

// Messages returns the stream as idem messages of scope; a repeated key has
// the same content and so the same fingerprint.
func (s Stream) Messages(scope string) []idem.Message {
	msgs := make([]idem.Message, len(s.Keys))
	for i, k := range s.Keys {
		msgs[i] = idem.Message{Scope: scope, Key: k, Fingerprint: idem.FingerprintBytes([]byte(k))}
	}
	return msgs
}

// eachMessage hands the deliveries one at a time to workers concurrent
// consumers; fn gets the consumer's index and the delivery's index. The
// first error stops every consumer.
func eachMessage(ctx context.Context, workers, n int, fn func(ctx context.Context, worker, i int) error) error {
	return eachBatch(ctx, workers, n, 1, func(ctx context.Context, worker, lo, _ int) error {
		return fn(ctx, worker, lo)
	})
}

// eachBatch hands the deliveries [lo, hi) in batches of at most size to
// workers concurrent consumers, in delivery order.
func eachBatch(ctx context.Context, workers, n, size int, fn func(ctx context.Context, worker, lo, hi int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				lo := int(next.Add(int64(size))) - size
				if lo >= n {
					return
				}
				if err := fn(ctx, w, lo, min(lo+size, n)); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// sortedUnique returns the distinct keys of keys in ascending order: the
// lock order that keeps concurrent multi-row inserts from deadlocking.
func sortedUnique(keys []string) []string {
	out := append([]string(nil), keys...)
	sort.Strings(out)
	j := 0
	for i, k := range out {
		if i == 0 || k != out[j-1] {
			out[j] = k
			j++
		}
	}
	return out[:j]
}
