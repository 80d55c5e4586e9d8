package demo

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/store/idemsqlite"
)

// TestPaymentRetries runs the exercise twice on one store with different
// keys: each is charged once and replayed to every other request; a third
// run reusing the first key charges nothing and every response replays.
func TestPaymentRetries(t *testing.T) {
	t.Parallel()
	store, err := idemsqlite.Open(t.Context(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"),
		&idemsqlite.Config{AutoMigrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, key := range []string{"pay-a", "pay-b"} {
		r, err := runPaymentRetries(t.Context(), store, key, 40)
		if err != nil {
			t.Fatal(err)
		}
		if err := httpVerdict(r); err != nil {
			t.Fatalf("%s: %v (%+v)", key, err, r)
		}
		if r.Status != http.StatusCreated || r.Identical != 39 || r.Charges != 1 || r.Originals != 1 {
			t.Fatalf("%s: %+v", key, r)
		}
	}
	r, err := runPaymentRetries(t.Context(), store, "pay-a", 5)
	if err != nil {
		t.Fatal(err)
	}
	if r.Charges != 0 || r.Originals != 0 || httpVerdict(r) == nil {
		t.Fatalf("retries of a completed payment: %+v, verdict %v", r, httpVerdict(r))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := runPaymentRetries(ctx, store, "pay-c", 3); err == nil || !strings.Contains(err.Error(), "demo: payment request") {
		t.Fatalf("cancelled run: got %v", err)
	}
}

func TestCompareResponses(t *testing.T) {
	t.Parallel()
	orig := demoResponse{status: 201, body: []byte(`{"id":"ch_1"}`), location: "/payments/ch_1"}
	replay := orig
	replay.replayed = true
	otherBody := replay
	otherBody.body = []byte(`{"id":"ch_2"}`)
	otherLoc := replay
	otherLoc.location = "/payments/ch_2"
	otherStatus := replay
	otherStatus.status = 200
	notReplayed := orig

	if o, st, n := compareResponses([]demoResponse{replay, orig, replay, otherBody, otherLoc, otherStatus}); o != 1 || st != 201 || n != 2 {
		t.Errorf("compareResponses = %d originals, status %d, %d identical; want 1, 201, 2", o, st, n)
	}
	if o, _, n := compareResponses([]demoResponse{orig, notReplayed, replay}); o != 2 || n != 1 {
		t.Errorf("two originals: %d originals, %d identical", o, n)
	}
	if o, st, n := compareResponses([]demoResponse{replay, replay}); o != 0 || st != 0 || n != 0 {
		t.Errorf("no original: %d, %d, %d", o, st, n)
	}
}

func TestHTTPVerdict(t *testing.T) {
	t.Parallel()
	good := httpDemoResult{Requests: 100, Charges: 1, Originals: 1, Status: 201, Identical: 99, Conflicts: 3}
	if err := httpVerdict(good); err != nil {
		t.Fatalf("verdict(good) = %v", err)
	}
	tests := []struct {
		name   string
		change func(*httpDemoResult)
		want   string
	}{
		{"charged twice", func(r *httpDemoResult) { r.Charges = 2 }, "2 charges for one payment"},
		{"never charged", func(r *httpDemoResult) { r.Charges = 0 }, "0 charges"},
		{"two originals", func(r *httpDemoResult) { r.Originals, r.Identical = 2, 98 }, "2 original responses, want 1; 98 of 99 retries"},
		{"original failed", func(r *httpDemoResult) { r.Status = 500 }, "the original response is 500, want 201"},
		{"a retry differs", func(r *httpDemoResult) { r.Identical = 98 }, "98 of 99 retries replayed"},
	}
	for _, tt := range tests {
		r := good
		tt.change(&r)
		err := httpVerdict(r)
		if err == nil || !strings.HasPrefix(err.Error(), "demo failed: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: verdict = %v, want %q", tt.name, err, tt.want)
		}
	}
}

func TestWriteHTTPTable(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	writeHTTPTable(&b, httpDemoResult{Requests: 10, Charges: 2, Originals: 2, Status: 201, Identical: 8, Conflicts: 4})
	out := b.String()
	for _, w := range []string{"  parallel requests                      10", "  charges                                 2   WRONG: want 1",
		"  identical replays                       8   of 9;", "  409s seen                               4   "} {
		if !strings.Contains(out, w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
}
