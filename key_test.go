package idem_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	valid := []string{
		"a", "order-42", `"quoted"`, "semi;colon", "100%", "star*", "a:b", "with space",
		strings.Repeat("k", idem.MaxKeyLen), "~!@#$%^&*()_+{}|<>?",
	}
	for _, k := range valid {
		if err := idem.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", k, err)
		}
	}
	invalid := map[string]string{
		"empty":     "",
		"too long":  strings.Repeat("k", idem.MaxKeyLen+1),
		"newline":   "a\nb",
		"tab":       "a\tb",
		"nul":       "a\x00b",
		"del":       "a\x7fb",
		"non-ascii": "clé",
		"emoji":     "🙂",
	}
	for name, k := range invalid {
		err := idem.ValidateKey(k)
		if !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("%s: ValidateKey(%q) = %v, want ErrInvalidKey", name, k, err)
		}
	}
}

func TestValidateScope(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "user:42", "POST /v1/charges", "ünïcode", strings.Repeat("s", idem.MaxScopeLen)} {
		if err := idem.ValidateScope(s); err != nil {
			t.Errorf("ValidateScope(%q) = %v", s, err)
		}
	}
	for _, s := range []string{strings.Repeat("s", idem.MaxScopeLen+1), "\xff\xfe"} {
		if err := idem.ValidateScope(s); !errors.Is(err, idem.ErrInvalidScope) {
			t.Errorf("ValidateScope(%q) = %v, want ErrInvalidScope", s, err)
		}
	}
	// Validate checks the key first, so a bad key is reported even with a bad scope.
	if err := idem.Validate("\xff", ""); !errors.Is(err, idem.ErrInvalidKey) {
		t.Errorf("Validate = %v, want ErrInvalidKey", err)
	}
}

func TestRetryableAndFinal(t *testing.T) {
	t.Parallel()
	base := errors.New("connection reset")
	if idem.Retryable(nil) != nil || idem.Final(nil) != nil {
		t.Fatal("marking nil must stay nil")
	}
	r := idem.Retryable(base)
	if !idem.IsRetryable(r) || !errors.Is(r, base) || r.Error() != base.Error() {
		t.Fatalf("Retryable lost the error: %v", r)
	}
	if idem.Retryable(r) != r {
		t.Error("double marking should not wrap again")
	}
	if idem.IsRetryable(base) || idem.IsFinal(base) {
		t.Error("an unmarked error is neither retryable nor final")
	}
	f := idem.Final(base)
	if !idem.IsFinal(f) || !errors.Is(f, base) {
		t.Fatalf("Final lost the error: %v", f)
	}
}

func TestContentID(t *testing.T) {
	a, b := idem.ContentID([]byte("order 1")), idem.ContentID([]byte("order 2"))
	if a == b || a != idem.ContentID([]byte("order 1")) {
		t.Fatalf("ContentID: %s %s", a, b)
	}
	if err := idem.ValidateKey(a); err != nil || len(a) != 64 {
		t.Fatalf("ContentID %q is not a 64-digit key: %v", a, err)
	}
	if got := idem.ContentID([]byte("abc")); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Fatalf("ContentID(abc) = %s, want the SHA-256 test vector", got)
	}
}

// driverErr is an error type of a driver or an application that says for
// itself whether it is retryable.
type driverErr struct{ retry bool }

func (e driverErr) Error() string   { return "driver error" }
func (e driverErr) Retryable() bool { return e.retry }

func TestIsRetryableAsksTheErrorItself(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"a retryable driver error", driverErr{retry: true}, true},
		{"a driver error that is not", driverErr{retry: false}, false},
		{"wrapped", fmt.Errorf("claim: %w", driverErr{retry: true}), true},
		{"a non-retryable wrapper over a retryable one", fmt.Errorf("%w: %w", driverErr{}, driverErr{retry: true}), true},
		{"joined", errors.Join(errors.New("x"), idem.Retryable(errors.New("y"))), true},
		{"joined, none retryable", errors.Join(errors.New("x"), driverErr{}), false},
		{"nil", nil, false},
	}
	for _, c := range cases {
		if got := idem.IsRetryable(c.err); got != c.want {
			t.Errorf("%s: IsRetryable = %v, want %v", c.name, got, c.want)
		}
	}
}
