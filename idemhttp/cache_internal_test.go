package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// noRaw is the raw digest of an entry cached without one.
var noRaw idem.Fingerprint

func testCache(t *testing.T, cfg ReplayCache) (*replayCache, *time.Time) {
	t.Helper()
	cc, err := cfg.validate()
	if err != nil {
		t.Fatal(err)
	}
	c := newReplayCache(cc)
	now := time.Unix(1_800_000_000, 0)
	c.now = func() time.Time { return now }
	return c, &now
}

func resp(body string) *storedResponse {
	return &storedResponse{status: 201, header: http.Header{"Content-Type": {"application/json"}}, body: []byte(body)}
}

func TestReplayCacheMaxAgeAndRecordExpiry(t *testing.T) {
	t.Parallel()
	c, now := testCache(t, ReplayCache{MaxAge: 5 * time.Second})
	fp := idem.FingerprintParts([]byte("a"))
	c.put("s", "k1", fp, noRaw, resp("1"), time.Time{})
	c.put("s", "k2", fp, noRaw, resp("2"), now.Add(2*time.Second)) // the record expires first
	if _, ok := c.get("s", "k1", fp); !ok {
		t.Fatal("k1 missing right after put")
	}
	*now = now.Add(2 * time.Second)
	if _, ok := c.get("s", "k2", fp); ok {
		t.Fatal("k2 served at its record's expiry")
	}
	if _, ok := c.get("s", "k1", fp); !ok {
		t.Fatal("k1 missing before MaxAge")
	}
	*now = now.Add(3 * time.Second)
	if _, ok := c.get("s", "k1", fp); ok {
		t.Fatal("k1 served MaxAge after it was cached")
	}
	if n, b := c.stats(); n != 0 || b != 0 {
		t.Fatalf("expired entries kept: %d entries, %d bytes", n, b)
	}
	// A record that has already expired is not cached at all.
	c.put("s", "k3", fp, noRaw, resp("3"), now.Add(-time.Second))
	if n, _ := c.stats(); n != 0 {
		t.Fatal("an expired record was cached")
	}
}

func TestReplayCacheRefusesWhatIsNotAResponse(t *testing.T) {
	t.Parallel()
	c, _ := testCache(t, ReplayCache{MaxBytes: 8 << 10})
	fp := idem.FingerprintParts([]byte("a"))
	c.put("s", "discarded", fp, noRaw, &storedResponse{status: 201, discarded: true}, time.Time{})
	c.put("s", "upgraded", fp, noRaw, &storedResponse{status: 101, discarded: true, upgraded: true}, time.Time{})
	c.put("s", "nil", fp, noRaw, nil, time.Time{})
	c.put("s", "big", fp, noRaw, resp(string(make([]byte, 2<<10))), time.Time{}) // over MaxBytes/8
	if n, _ := c.stats(); n != 0 {
		t.Fatalf("%d entries cached, want none", n)
	}
	var nilCache *replayCache
	nilCache.put("s", "k", fp, noRaw, resp("x"), time.Time{})
	nilCache.forget("s", "k")
	if _, ok := nilCache.get("s", "k", fp); ok {
		t.Fatal("nil cache served an entry")
	}
}

func TestReplayCacheFingerprintAndScope(t *testing.T) {
	t.Parallel()
	c, _ := testCache(t, ReplayCache{})
	a, b := idem.FingerprintParts([]byte("a")), idem.FingerprintParts([]byte("b"))
	c.put(Scope("alice", "POST", "/p"), "k", a, noRaw, resp("alice"), time.Time{})
	if _, ok := c.get(Scope("alice", "POST", "/p"), "k", b); ok {
		t.Fatal("served for another fingerprint")
	}
	if _, ok := c.get(Scope("bob", "POST", "/p"), "k", a); ok {
		t.Fatal("served to another principal")
	}
	if sr, ok := c.get(Scope("alice", "POST", "/p"), "k", a); !ok || string(sr.body) != "alice" {
		t.Fatalf("alice's own entry: %v %v", sr, ok)
	}
	c.forget(Scope("alice", "POST", "/p"), "k")
	if _, ok := c.get(Scope("alice", "POST", "/p"), "k", a); ok {
		t.Fatal("served after forget")
	}
}

func TestReplayCacheBounds(t *testing.T) {
	t.Parallel()
	fp := idem.FingerprintParts([]byte("a"))
	c, _ := testCache(t, ReplayCache{MaxEntries: 10})
	for i := range 25 {
		c.put("s", fmt.Sprint(i), fp, noRaw, resp("x"), time.Time{})
		if i == 5 {
			c.get("s", "0", fp) // recently used: survives the evictions
		}
	}
	if n, _ := c.stats(); n != 10 {
		t.Fatalf("%d entries, want 10", n)
	}
	if _, ok := c.get("s", "24", fp); !ok {
		t.Fatal("newest entry evicted")
	}
	if _, ok := c.get("s", "1", fp); ok {
		t.Fatal("least recently used entry kept")
	}

	c, _ = testCache(t, ReplayCache{MaxBytes: 64 << 10})
	body := string(make([]byte, 4<<10))
	for i := range 100 {
		c.put("s", fmt.Sprint(i), fp, noRaw, resp(body), time.Time{})
		c.put("s", fmt.Sprint(i), fp, noRaw, resp(body), time.Time{}) // a replacement counts once
	}
	if _, b := c.stats(); b > 64<<10 || b < 32<<10 {
		t.Fatalf("%d bytes cached, want at most %d and most of it used", b, 64<<10)
	}
}

func TestReplayCacheConcurrent(t *testing.T) {
	t.Parallel()
	c, _ := testCache(t, ReplayCache{MaxEntries: 100})
	c.now = time.Now
	fp := idem.FingerprintParts([]byte("a"))
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Go(func() {
			for i := range 500 {
				k := fmt.Sprint((g*7 + i) % 300)
				switch i % 3 {
				case 0:
					c.put("s", k, fp, noRaw, resp(k), time.Time{})
				case 1:
					if sr, ok := c.get("s", k, fp); ok && string(sr.body) != k {
						t.Errorf("key %s served %q", k, sr.body)
					}
				default:
					c.forget("s", k)
				}
			}
		})
	}
	wg.Wait()
	if n, _ := c.stats(); n > 100 {
		t.Fatalf("%d entries, bound 100", n)
	}
}

func TestReplayCacheConfig(t *testing.T) {
	t.Parallel()
	for _, bad := range []ReplayCache{{MaxEntries: -1}, {MaxBytes: -1}, {MaxAge: -time.Second}, {MaxAge: 2 * time.Minute}} {
		if _, err := New(nopStore{}, &Config{SharedScope: true, AllowNonDurable: true, Cache: &bad}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
	cc, err := (&ReplayCache{}).validate()
	if err != nil || cc.MaxEntries != DefaultCacheEntries || cc.MaxBytes != DefaultCacheBytes || cc.MaxAge != DefaultCacheMaxAge {
		t.Fatalf("defaults: %+v %v", cc, err)
	}
}
