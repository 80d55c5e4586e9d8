// Package bounded holds a concurrency-safe map with a bound on its size,
// for the broker adapters' memory of retry state between redeliveries. It
// is shared by modules of this repository and has no compatibility promise.
package bounded

import "sync"

// Map maps keys to values, safe for concurrent use, and holds at most its
// bound of entries: a Put of a new key into a full Map first forgets an
// arbitrary entry (its owner must fall back on something else, such as a
// broker's delivery count).
type Map[K comparable, V any] struct {
	mu  sync.Mutex
	max int
	m   map[K]V
}

// New returns a Map that holds at most n entries (at least one).
func New[K comparable, V any](n int) *Map[K, V] {
	return &Map[K, V]{max: max(n, 1), m: make(map[K]V)}
}

// Get returns the value of k and whether there is one.
func (b *Map[K, V]) Get(k K) (V, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.m[k]
	return v, ok
}

// Put sets the value of k, forgetting another entry if the Map is full.
func (b *Map[K, V]) Put(k K, v V) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.m[k]; !ok && len(b.m) >= b.max {
		for old := range b.m {
			delete(b.m, old)
			break
		}
	}
	b.m[k] = v
}

// Delete forgets k.
func (b *Map[K, V]) Delete(k K) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, k)
}

// Len is the number of entries.
func (b *Map[K, V]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
