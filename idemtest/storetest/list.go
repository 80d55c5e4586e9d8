package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// ListOptions tune RunList for a store.
type ListOptions struct {
	// Unordered says that the store lists records in no particular order
	// and may list one twice (Redis SCAN). Otherwise the suite wants each
	// record once, in (scope, key) order, with the store's own order of
	// strings checked only for the ASCII scopes and keys it writes.
	Unordered bool
}

// RunList runs the [idem.Lister] conformance suite as parallel subtests of
// one subtest named "List", and returns when all of them have finished.
// newStore must return a store over an isolated namespace, as for [Run],
// that implements idem.Lister. It is separate from Run so that a store
// without a listing still passes Run. opts may be nil.
func RunList(t *testing.T, newStore func(t *testing.T) idem.Store, opts *ListOptions) {
	t.Helper()
	var o ListOptions
	if opts != nil {
		o = *opts
	}
	t.Run("List", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			fn   func(*testing.T, idem.Store, ListOptions)
		}{
			{"Filters", testListFilters},
			{"Pages", testListPages},
			{"Invalid", testListInvalid},
			{"Empty", testListEmpty},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t, newStore(t), o)
			})
		}
	})
}

func lister(t *testing.T, s idem.Store) idem.Lister {
	t.Helper()
	l, ok := s.(idem.Lister)
	if !ok {
		t.Fatalf("contract: RunList needs a store that implements idem.Lister, got %T", s)
	}
	return l
}

// listSeed is the scopes and keys testListFilters writes: keys repeated
// across scopes, scopes sharing prefixes, an HTTP middleware's scope.
var listSeed = []struct {
	scope, key string
	completed  bool
}{
	{"orders", "k1", true},
	{"orders", "k2", false},
	{"orders/eu", "k1", true},
	{"orders/eu", "x-9", true},
	{"payments", "k1", false},
	{"payments", "k10", true},
	{`http "authz-sha256:ab" POST /pay`, "k1", true},
	{`http "authz-sha256:ab" POST /pay`, "req-7", false},
}

// seedList writes listSeed and returns the records as Get reads them,
// without their results.
func seedList(t *testing.T, s idem.Store) []idem.Record {
	t.Helper()
	ctx := context.Background()
	var recs []idem.Record
	for _, r := range listSeed {
		c := acquire(t, s, idem.ClaimRequest{Scope: r.scope, Key: r.key, Fingerprint: fp(r.key), Lease: longLease})
		if r.completed {
			if err := s.Complete(ctx, idem.CompleteRequest{Scope: r.scope, Key: r.key, Token: c.Token,
				Result: []byte("result of " + r.key), Retention: longRetention}); err != nil {
				t.Fatalf("Complete(%q, %q): %v", r.scope, r.key, err)
			}
		}
		rec := get(t, s, r.scope, r.key)
		rec.Result = nil
		recs = append(recs, rec)
	}
	return recs
}

// listAll pages through a listing with limit records a page and returns
// every record, checking each page's size and that the listing ends.
func listAll(t *testing.T, l idem.Lister, f idem.ListFilter, limit int) []idem.Record {
	t.Helper()
	var out []idem.Record
	req := idem.ListRequest{Filter: f, Limit: limit}
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatalf("contract: a listing of %+v must end; still going after %d pages", f, pages)
		}
		page, err := l.List(context.Background(), req)
		if err != nil {
			t.Fatalf("List(%+v, cursor %q): unexpected error: %v", f, req.Cursor, err)
		}
		if want := limit; want == 0 && len(page.Records) > idem.DefaultListLimit || want > 0 && len(page.Records) > want {
			t.Fatalf("contract: a page must hold at most Limit (%d) records, got %d", limit, len(page.Records))
		}
		for _, r := range page.Records {
			if r.Result != nil {
				t.Errorf("contract: listed records carry no result, got %q for key %q", r.Result, r.Key)
			}
		}
		out = append(out, page.Records...)
		if page.Next == "" {
			return out
		}
		if page.Next == req.Cursor {
			t.Fatalf("contract: List must move on: the next cursor is the one it was given (%q)", page.Next)
		}
		req.Cursor = page.Next
	}
}

func recordID(r idem.Record) string { return r.Scope + "\x00" + r.Key }

// wantListed fails unless got holds exactly the records of all that f
// matches, equal to them field by field.
func wantListed(t *testing.T, o ListOptions, f idem.ListFilter, got, all []idem.Record, contract string) {
	t.Helper()
	want := map[string]idem.Record{}
	for _, r := range all {
		if f.Match(r) {
			want[recordID(r)] = r
		}
	}
	seen := map[string]bool{}
	for i, r := range got {
		id := recordID(r)
		if seen[id] && !o.Unordered {
			t.Errorf("contract: %s: record (%q, %q) listed twice", contract, r.Scope, r.Key)
		}
		seen[id] = true
		w, ok := want[id]
		if !ok {
			t.Errorf("contract: %s: listed (%q, %q), which the filter does not match or the store does not hold", contract, r.Scope, r.Key)
			continue
		}
		if !sameListed(r, w) {
			t.Errorf("contract: %s: listed record differs from Get's:\n got  %+v\n want %+v", contract, r, w)
		}
		if !o.Unordered && i > 0 && recordID(got[i-1]) > id {
			t.Errorf("contract: %s: records must come in (scope, key) order: (%q, %q) after (%q, %q)",
				contract, r.Scope, r.Key, got[i-1].Scope, got[i-1].Key)
		}
	}
	for id, r := range want {
		if !seen[id] {
			t.Errorf("contract: %s: record (%q, %q) matches but was not listed", contract, r.Scope, r.Key)
		}
	}
}

func sameListed(a, b idem.Record) bool {
	a.Result, b.Result = nil, nil
	return a.Scope == b.Scope && a.Key == b.Key && a.State == b.State && a.Fingerprint == b.Fingerprint &&
		a.Token == b.Token && a.Failed == b.Failed && a.Tombstone == b.Tombstone &&
		a.CreatedAt.Equal(b.CreatedAt) && a.LeaseExpiresAt.Equal(b.LeaseExpiresAt) &&
		a.CompletedAt.Equal(b.CompletedAt) && a.ExpiresAt.Equal(b.ExpiresAt)
}

func testListFilters(t *testing.T, s idem.Store, o ListOptions) {
	l := lister(t, s)
	all := seedList(t, s)
	now := time.Now()
	httpScope := listSeed[len(listSeed)-1].scope
	for _, tc := range []struct {
		name string
		f    idem.ListFilter
		n    int
	}{
		{"everything", idem.ListFilter{}, len(listSeed)},
		{"key across scopes", idem.ListFilter{Key: "k1"}, 4},
		{"key prefix", idem.ListFilter{KeyPrefix: "k1"}, 5},
		{"scope", idem.ListFilter{Scope: "orders"}, 2},
		{"scope and key", idem.ListFilter{Scope: "payments", Key: "k10"}, 1},
		{"scope and key prefix", idem.ListFilter{Scope: "orders/eu", KeyPrefix: "x-"}, 1},
		{"scope prefix", idem.ListFilter{ScopePrefix: "orders"}, 4},
		{"scope hash", idem.ListFilter{ScopeHash: idem.ScopeHash(httpScope)}, 2},
		{"scope hash and key", idem.ListFilter{ScopeHash: idem.ScopeHash(httpScope), Key: "req-7"}, 1},
		{"in progress", idem.ListFilter{State: idem.StateInProgress}, 3},
		{"completed", idem.ListFilter{State: idem.StateCompleted}, 5},
		{"created after", idem.ListFilter{CreatedAfter: now.Add(-clockSkew)}, len(listSeed)},
		{"created before", idem.ListFilter{CreatedBefore: now.Add(-clockSkew)}, 0},
		// Completed records expire after their retention; how long an
		// abandoned lease is kept is up to the store.
		{"expires within", idem.ListFilter{ExpiresAfter: now.Add(longRetention - clockSkew), ExpiresBefore: now.Add(longRetention + clockSkew)}, 5},
		{"expires after", idem.ListFilter{ExpiresAfter: now.Add(longRetention + clockSkew), State: idem.StateCompleted}, 0},
		{"expires before", idem.ListFilter{ExpiresBefore: now.Add(longRetention - clockSkew), State: idem.StateCompleted}, 0},
		{"absent key", idem.ListFilter{Key: "nope"}, 0},
		{"absent scope", idem.ListFilter{Scope: "ordersx"}, 0},
	} {
		for _, limit := range []int{0, 1, 3} {
			got := listAll(t, l, tc.f, limit)
			contract := fmt.Sprintf("List filter %s, limit %d", tc.name, limit)
			wantListed(t, o, tc.f, got, all, contract)
			if n := distinct(got); n != tc.n {
				t.Errorf("contract: %s: want %d records, got %d", contract, tc.n, n)
			}
		}
	}

	// A deleted record is no longer listed.
	if err := s.Delete(context.Background(), "orders", "k1"); err != nil {
		t.Fatal(err)
	}
	all = slices.DeleteFunc(all, func(r idem.Record) bool { return r.Scope == "orders" && r.Key == "k1" })
	wantListed(t, o, idem.ListFilter{}, listAll(t, l, idem.ListFilter{}, 2), all, "List after Delete")
}

func distinct(recs []idem.Record) int {
	ids := map[string]bool{}
	for _, r := range recs {
		ids[recordID(r)] = true
	}
	return len(ids)
}

// testListPages lists more records than a page holds, in many scopes, with
// keys full of the characters a glob or a LIKE pattern would take for
// wildcards.
func testListPages(t *testing.T, s idem.Store, o ListOptions) {
	l := lister(t, s)
	ctx := context.Background()
	var all []idem.Record
	for i := range 120 {
		sc := fmt.Sprintf("scope-%d", i%7)
		key := fmt.Sprintf("%%_*?[%03d]\\", i)
		c := acquire(t, s, idem.ClaimRequest{Scope: sc, Key: key, Fingerprint: fp(key), Lease: longLease})
		if i%2 == 0 {
			if err := s.Complete(ctx, idem.CompleteRequest{Scope: sc, Key: key, Token: c.Token, Result: []byte("r"), Retention: longRetention}); err != nil {
				t.Fatal(err)
			}
		}
		rec := get(t, s, sc, key)
		rec.Result = nil
		all = append(all, rec)
	}
	for _, limit := range []int{1, 7, 50, idem.MaxListLimit} {
		got := listAll(t, l, idem.ListFilter{}, limit)
		wantListed(t, o, idem.ListFilter{}, got, all, fmt.Sprintf("List everything, limit %d", limit))
	}
	f := idem.ListFilter{KeyPrefix: "%_*?[01"}
	wantListed(t, o, f, listAll(t, l, f, 4), all, "List by a key prefix of wildcard characters")
	if n := distinct(listAll(t, l, f, 4)); n != 10 {
		t.Errorf("contract: a key prefix is matched literally: want 10 keys starting %q, got %d", f.KeyPrefix, n)
	}
	f = idem.ListFilter{Scope: "scope-3", State: idem.StateCompleted}
	wantListed(t, o, f, listAll(t, l, f, 5), all, "List a scope's completed records")
}

func testListInvalid(t *testing.T, s idem.Store, _ ListOptions) {
	l := lister(t, s)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  idem.ListRequest
	}{
		{"negative limit", idem.ListRequest{Limit: -1}},
		{"limit above the maximum", idem.ListRequest{Limit: idem.MaxListLimit + 1}},
		{"unknown state", idem.ListRequest{Filter: idem.ListFilter{State: "done"}}},
		{"scope hash too short", idem.ListRequest{Filter: idem.ListFilter{ScopeHash: "a4c81e4d"}}},
		{"scope hash in upper case", idem.ListRequest{Filter: idem.ListFilter{ScopeHash: "A4C81E4D4B6ECDC9"}}},
		{"cursor of nothing", idem.ListRequest{Cursor: "not a cursor"}},
	} {
		_, err := l.List(ctx, tc.req)
		wantErr(t, err, idem.ErrInvalidConfig, "List with "+tc.name)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.List(cancelled, idem.ListRequest{}); !errors.Is(err, context.Canceled) {
		t.Errorf("contract: List with a cancelled context must fail with an error wrapping context.Canceled, got %v", err)
	}
}

func testListEmpty(t *testing.T, s idem.Store, o ListOptions) {
	l := lister(t, s)
	if got := listAll(t, l, idem.ListFilter{}, 0); len(got) != 0 {
		t.Errorf("contract: an empty store lists nothing, got %d records, first (%q, %q)", len(got), got[0].Scope, got[0].Key)
	}
	got := listAll(t, l, idem.ListFilter{ScopePrefix: strings.Repeat("z", 10)}, 1)
	if len(got) != 0 {
		t.Errorf("contract: a filter that matches nothing lists nothing, got %d records", len(got))
	}
}
