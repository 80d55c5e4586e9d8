package idem_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// The scope hash is the first 8 bytes of SHA-256(scope), in hex: the one
// the HTTP middleware and the proxy log, and filters take.
func TestScopeHash(t *testing.T) {
	for sc, want := range map[string]string{"": "e3b0c44298fc1c14", "orders": "1c168adb00d208e4"} {
		if got := idem.ScopeHash(sc); got != want {
			t.Errorf("ScopeHash(%q) = %s, want %s", sc, got, want)
		}
	}
}

func TestListFilterMatch(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := idem.Record{Scope: "orders/eu", Key: "k12", State: idem.StateCompleted, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	for _, tc := range []struct {
		f    idem.ListFilter
		want bool
	}{
		{idem.ListFilter{}, true},
		{idem.ListFilter{Key: "k12", Scope: "orders/eu"}, true},
		{idem.ListFilter{Key: "k1"}, false},
		{idem.ListFilter{KeyPrefix: "k1", ScopePrefix: "orders"}, true},
		{idem.ListFilter{ScopePrefix: "orders/us"}, false},
		{idem.ListFilter{Scope: "orders"}, false},
		{idem.ListFilter{ScopeHash: idem.ScopeHash("orders/eu")}, true},
		{idem.ListFilter{ScopeHash: idem.ScopeHash("orders")}, false},
		{idem.ListFilter{State: idem.StateInProgress}, false},
		{idem.ListFilter{CreatedAfter: t0, CreatedBefore: t0.Add(time.Nanosecond)}, true},
		{idem.ListFilter{CreatedBefore: t0}, false},
		{idem.ListFilter{CreatedAfter: t0.Add(time.Nanosecond)}, false},
		{idem.ListFilter{ExpiresBefore: t0.Add(time.Hour)}, false},
		{idem.ListFilter{ExpiresAfter: t0.Add(time.Hour)}, true},
	} {
		if got := tc.f.Match(rec); got != tc.want {
			t.Errorf("%+v.Match = %v, want %v", tc.f, got, tc.want)
		}
	}
}

func TestValidateList(t *testing.T) {
	req, err := idem.ValidateList(idem.ListRequest{})
	if err != nil || req.Limit != idem.DefaultListLimit {
		t.Errorf("ValidateList of the zero request: got limit %d, %v; want %d", req.Limit, err, idem.DefaultListLimit)
	}
	for _, bad := range []idem.ListRequest{
		{Limit: -1},
		{Limit: idem.MaxListLimit + 1},
		{Filter: idem.ListFilter{State: "done"}},
		{Filter: idem.ListFilter{ScopeHash: "a4c81e4d4b6ecdc"}},
		{Filter: idem.ListFilter{ScopeHash: "a4c81e4d4b6ecdcz"}},
	} {
		if _, err := idem.ValidateList(bad); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("ValidateList(%+v): want ErrInvalidConfig, got %v", bad, err)
		}
	}
}
