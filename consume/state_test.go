package consume_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
)

func TestStateHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	dl := consume.DeadLetter{
		State:  consume.State{Attempts: 3, InfraRetries: 2, FirstFailure: t0, LastFailure: t0.Add(time.Minute), LastError: "boom"},
		Reason: idem.DeadMaxAttempts, Consumer: "c", Origin: "ex/rk",
		OriginalID: "order-1", DeadLetterID: consume.DeadLetterID("orders", "0", "42"),
	}
	h := dl.Headers()
	get := func(k string) (string, bool) { v, ok := h[k]; return v, ok }
	got := consume.ParseDeadLetter(get)
	if !got.FirstFailure.Equal(t0) || !got.LastFailure.Equal(t0.Add(time.Minute)) {
		t.Fatalf("times %+v", got)
	}
	got.FirstFailure, got.LastFailure = dl.FirstFailure, dl.LastFailure
	if got != dl {
		t.Fatalf("round trip %+v != %+v", got, dl)
	}
	if len((consume.State{}).Headers()) != 0 {
		t.Fatal("zero state has headers")
	}
	bad := map[string]string{consume.HeaderAttempts: "-4", consume.HeaderInfraRetries: "x", consume.HeaderFirstFailure: "yesterday"}
	st := consume.ParseState(func(k string) (string, bool) { v, ok := bad[k]; return v, ok })
	if st != (consume.State{}) {
		t.Fatalf("malformed headers gave %+v", st)
	}
}

// Messages dead-lettered by older versions read with today's reasons.
func TestParseDeadLetterLegacyReasons(t *testing.T) {
	t.Parallel()
	for old, want := range map[string]idem.DeadReason{
		"id_conflict":          idem.DeadMismatch,
		"mismatch":             idem.DeadMismatch,
		"max_attempts":         idem.DeadMaxAttempts,
		"permanent":            idem.DeadPermanent,
		"missing_id":           idem.DeadMissingID,
		"invalid_id":           idem.DeadInvalidID,
		"":                     "",
		"from a newer version": "from a newer version",
	} {
		h := map[string]string{consume.HeaderReason: old, consume.HeaderAttempts: "2"}
		dl := consume.ParseDeadLetter(func(k string) (string, bool) { v, ok := h[k]; return v, ok })
		if dl.Reason != want || dl.Attempts != 2 {
			t.Errorf("reason %q read as %+v, want %q", old, dl, want)
		}
	}
	// A dead letter written today carries the new spelling.
	if h := (consume.DeadLetter{Reason: idem.DeadMismatch}).Headers(); h[consume.HeaderReason] != "mismatch" {
		t.Fatalf("headers %v", h)
	}
}

func TestDeadLetterID(t *testing.T) {
	t.Parallel()
	id := consume.DeadLetterID("orders", "0", "42")
	if id != consume.DeadLetterID("orders", "0", "42") || !strings.HasPrefix(id, "dl-") || len(id) != 67 || idem.ValidateKey(id) != nil {
		t.Fatalf("id %q", id)
	}
	// Length-prefixed: moving a boundary makes another id.
	for _, other := range [][]string{{"orders", "04", "2"}, {"orders0", "42"}, {"orders", "0", "43"}} {
		if consume.DeadLetterID(other...) == id {
			t.Fatalf("%q collides with %q", other, id)
		}
	}
	// No id headers when they are unset.
	h := (consume.DeadLetter{Reason: idem.DeadPermanent}).Headers()
	if _, ok := h[consume.HeaderOriginalID]; ok {
		t.Fatalf("headers %v", h)
	}
	if _, ok := h[consume.HeaderDeadLetterID]; ok {
		t.Fatalf("headers %v", h)
	}
}

func TestCheckRetention(t *testing.T) {
	t.Parallel()
	if err := consume.CheckRetention(24*time.Hour, 5, time.Minute, consume.Window{Name: "queue x-message-ttl", D: time.Hour}); err != nil {
		t.Fatal(err)
	}
	err := consume.CheckRetention(10*time.Minute, 6, 5*time.Minute)
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "10m0s") || !strings.Contains(err.Error(), "30m0s") || !strings.Contains(err.Error(), "max_attempts 6") {
		t.Fatalf("err = %v", err)
	}
	err = consume.CheckRetention(time.Hour, 5, time.Minute, consume.Window{Name: "queue x-message-ttl", D: 2 * time.Hour})
	if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "1h0m0s") || !strings.Contains(err.Error(), "2h0m0s (queue x-message-ttl)") {
		t.Fatalf("err = %v", err)
	}
	if err := consume.CheckRetention(0, 1, time.Second); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if h := consume.Horizon(1<<40, time.Hour); h.D != time.Duration(1<<63-1) {
		t.Fatalf("overflow: %v", h.D)
	}
}
