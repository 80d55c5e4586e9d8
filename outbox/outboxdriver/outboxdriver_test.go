package outboxdriver_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox/outboxdriver"
)

func TestPrepare(t *testing.T) {
	t.Parallel()
	a, err := outboxdriver.Prepare(outboxdriver.Event{Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := outboxdriver.Prepare(outboxdriver.Event{Topic: "t"})
	if len(a.ID) != 32 || a.ID == b.ID || a.Payload == nil {
		t.Fatalf("generated ids %q, %q; payload %v", a.ID, b.ID, a.Payload)
	}
	if p, err := outboxdriver.Prepare(outboxdriver.Event{Topic: "t", ID: "keep-me", Headers: map[string]string{"X-Trace": "1"}}); err != nil || p.ID != "keep-me" {
		t.Fatalf("Prepare = %+v, %v", p, err)
	}
	for name, ev := range map[string]outboxdriver.Event{
		"proxy auth":  {Topic: "t", Headers: map[string]string{"proxy-authorization": "x"}},
		"set-cookie":  {Topic: "t", Headers: map[string]string{"SET-COOKIE": "x"}},
		"empty name":  {Topic: "t", Headers: map[string]string{"": "x"}},
		"bad value":   {Topic: "t", Headers: map[string]string{"a": "\xff"}},
		"control id":  {Topic: "t", ID: "a\x00"},
		"long header": {Topic: "t", Headers: map[string]string{strings.Repeat("h", outboxdriver.MaxHeaderNameLen+1): "x"}},
	} {
		if _, err := outboxdriver.Prepare(ev); !errors.Is(err, idem.ErrInvalidConfig) && !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestHeaders(t *testing.T) {
	t.Parallel()
	if outboxdriver.EncodeHeaders(nil) != "" {
		t.Fatal("no headers are not stored as \"\"")
	}
	h := map[string]string{"a": "1", "ü": "\"quoted\""}
	got, err := outboxdriver.DecodeHeaders(outboxdriver.EncodeHeaders(h))
	if err != nil || len(got) != 2 || got["ü"] != `"quoted"` {
		t.Fatalf("round trip = %v, %v", got, err)
	}
	if got, err := outboxdriver.DecodeHeaders(""); got != nil || err != nil {
		t.Fatalf("DecodeHeaders(\"\") = %v, %v", got, err)
	}
	if _, err := outboxdriver.DecodeHeaders("{bad"); err == nil {
		t.Fatal("corrupt headers decoded")
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	for _, s := range outboxdriver.States() {
		if st, err := outboxdriver.ParseState(string(s)); err != nil || st != s {
			t.Fatalf("ParseState(%s) = %v, %v", s, st, err)
		}
	}
	if _, err := outboxdriver.ParseState("running"); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("ParseState(running) = %v", err)
	}
	if n, err := outboxdriver.ValidatePurge(time.Hour, 0, 7); err != nil || n != 7 {
		t.Fatalf("ValidatePurge default = %d, %v", n, err)
	}
	if n, err := outboxdriver.ListLimit(outboxdriver.ListRequest{State: outboxdriver.StateDead}); err != nil || n != 100 {
		t.Fatalf("ListLimit default = %d, %v", n, err)
	}
	if _, err := outboxdriver.PrepareAll(nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("PrepareAll(nil) = %v", err)
	}
	if err := outboxdriver.ValidateSelect(outboxdriver.Select{IDs: []int64{1}}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(outboxdriver.NotFound("x", 1), idem.ErrNotFound) {
		t.Fatal("NotFound does not wrap idem.ErrNotFound")
	}
}
