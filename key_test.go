package idem_test

import (
	"errors"
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
