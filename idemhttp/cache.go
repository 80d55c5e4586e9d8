package idemhttp

import (
	"container/list"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Replay cache defaults (see [ReplayCache]).
const (
	DefaultCacheEntries = 10000
	DefaultCacheBytes   = 32 << 20
	DefaultCacheMaxAge  = 5 * time.Second
)

// ReplayCache configures the middleware's in-memory cache of completed
// responses, which answers a replay without a store round trip. A completed
// record never changes until its retention ends or an operator deletes it,
// so the cache only has to bound how long it can lag behind such a delete:
//
//   - an entry is served for at most MaxAge after it was cached, and never
//     after the record's own expiry; so a record an operator deleted (on
//     any instance, through any tool) may still be replayed by this
//     instance for up to MaxAge, and never longer;
//   - only completed responses are cached: the response this instance
//     recorded itself (outcome processed) or read from the store on a
//     replay. In-progress keys, mismatches, tombstones, in-doubt outcomes
//     and errors always go to the store;
//   - an entry is keyed by scope and key, and the scope holds the
//     principal, so one principal never receives another's entry; a
//     request whose fingerprint differs from the entry's goes to the store
//     (which answers 422). A request byte for byte like the one that
//     filled the entry (same method, route, URI, Content-Type,
//     Content-Encoding, significant headers and body, by their SHA-256) is
//     answered before its body is decoded and canonicalised: its
//     fingerprint could not differ;
//   - entries and bytes are bounded; the least recently used entry goes
//     first.
//
// A cached replay does not reach the [idem.Guard], so Guard hooks
// (idem.DoStartHook, idem.DoEndHook) do not see it; the middleware's
// request hooks do, with outcome duplicate.
type ReplayCache struct {
	// MaxEntries bounds the number of entries. Default DefaultCacheEntries.
	MaxEntries int
	// MaxBytes bounds the entries' total size (bodies, headers, keys).
	// Default DefaultCacheBytes. A response larger than an eighth of it is
	// not cached.
	MaxBytes int64
	// MaxAge is the longest an entry is served, and so the bound on how
	// long a deleted record can still be replayed. Default
	// DefaultCacheMaxAge; at most a minute.
	MaxAge time.Duration
}

// maxCacheAge bounds ReplayCache.MaxAge: the cache is a speed-up for
// retries in quick succession, not a second store.
const maxCacheAge = time.Minute

func (c *ReplayCache) validate() (ReplayCache, error) {
	out := *c
	switch {
	case out.MaxEntries < 0:
		return out, fmt.Errorf("idemhttp: %w: ReplayCache.MaxEntries must not be negative, got %d", idem.ErrInvalidConfig, out.MaxEntries)
	case out.MaxBytes < 0:
		return out, fmt.Errorf("idemhttp: %w: ReplayCache.MaxBytes must not be negative, got %d", idem.ErrInvalidConfig, out.MaxBytes)
	case out.MaxAge < 0 || out.MaxAge > maxCacheAge:
		return out, fmt.Errorf("idemhttp: %w: ReplayCache.MaxAge %v out of range (0, %v]", idem.ErrInvalidConfig, out.MaxAge, maxCacheAge)
	}
	if out.MaxEntries == 0 {
		out.MaxEntries = DefaultCacheEntries
	}
	if out.MaxBytes == 0 {
		out.MaxBytes = DefaultCacheBytes
	}
	if out.MaxAge == 0 {
		out.MaxAge = DefaultCacheMaxAge
	}
	return out, nil
}

// replayCache is the bounded LRU behind ReplayCache.
type replayCache struct {
	cfg ReplayCache
	now func() time.Time

	mu    sync.Mutex
	items map[cacheKey]*list.Element
	lru   list.List // front = most recently used; values are *cacheEntry
	bytes int64
}

type cacheKey struct{ scope, key string }

type cacheEntry struct {
	k       cacheKey
	fp      idem.Fingerprint
	raw     idem.Fingerprint // the request's raw digest; zero: none
	resp    *storedResponse
	size    int64
	expires time.Time
}

// entryOverhead is what one entry costs beyond its strings and body.
const entryOverhead = 256

func newReplayCache(cfg ReplayCache) *replayCache {
	return &replayCache{cfg: cfg, now: time.Now, items: map[cacheKey]*list.Element{}}
}

// get returns the response cached for (scope, key) when it is live and
// was recorded for fp.
func (c *replayCache) get(scope, key string, fp idem.Fingerprint) (*storedResponse, bool) {
	return c.find(scope, key, fp, false)
}

// getRaw is get for a request whose raw digest (see rawFingerprint) is
// raw: it finds the entry cached for the request with that digest.
func (c *replayCache) getRaw(scope, key string, raw idem.Fingerprint) (*storedResponse, bool) {
	if raw == (idem.Fingerprint{}) {
		return nil, false
	}
	return c.find(scope, key, raw, true)
}

func (c *replayCache) find(scope, key string, want idem.Fingerprint, raw bool) (*storedResponse, bool) {
	if c == nil {
		return nil, false
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[cacheKey{scope, key}]
	if !ok {
		return nil, false
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.expires) {
		c.removeLocked(el)
		return nil, false
	}
	if (!raw && e.fp != want) || (raw && e.raw != want) {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return e.resp, true
}

// put caches resp, a completed response of (scope, key) recorded for fp,
// until at most MaxAge from now and never past recordExpires (when not
// zero). raw is the raw digest of the request that brought it (zero: none).
// Discarded and upgraded responses are not cached.
func (c *replayCache) put(scope, key string, fp, raw idem.Fingerprint, resp *storedResponse, recordExpires time.Time) {
	if c == nil || resp == nil || resp.discarded || resp.upgraded {
		return
	}
	size := int64(entryOverhead + len(scope) + len(key) + len(resp.body))
	for k, vs := range resp.header {
		for _, v := range vs {
			size += int64(len(k) + len(v) + 16)
		}
	}
	if size > c.cfg.MaxBytes/8 {
		return
	}
	now := c.now()
	expires := now.Add(c.cfg.MaxAge)
	if !recordExpires.IsZero() && recordExpires.Before(expires) {
		expires = recordExpires
	}
	if !now.Before(expires) {
		return
	}
	if resp.lines == nil {
		resp.lines = newReplayLines(resp)
	}
	e := &cacheEntry{k: cacheKey{scope, key}, fp: fp, raw: raw, resp: resp, size: size, expires: expires}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[e.k]; ok {
		c.removeLocked(el)
	}
	c.items[e.k] = c.lru.PushFront(e)
	c.bytes += size
	for len(c.items) > c.cfg.MaxEntries || c.bytes > c.cfg.MaxBytes {
		c.removeLocked(c.lru.Back())
	}
}

// forget drops the entry of (scope, key), if any.
func (c *replayCache) forget(scope, key string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[cacheKey{scope, key}]; ok {
		c.removeLocked(el)
	}
}

func (c *replayCache) removeLocked(el *list.Element) {
	e := c.lru.Remove(el).(*cacheEntry)
	delete(c.items, e.k)
	c.bytes -= e.size
}

// stats returns the number of entries and their bytes, for tests.
func (c *replayCache) stats() (entries int, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.items), c.bytes
}
