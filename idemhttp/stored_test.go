package idemhttp

import (
	"net/http"
	"strings"
	"testing"
)

func TestDecodeStoredResponse(t *testing.T) {
	t.Parallel()
	in := &storedResponse{status: 201, header: http.Header{"Content-Type": {"application/json"}, "Request-Id": {"req_1"}}, body: []byte(`{"id":"ch_1"}`)}
	got, err := DecodeStoredResponse(in.encode())
	if err != nil || got.Status != 201 || got.Header.Get("Request-Id") != "req_1" || string(got.Body) != `{"id":"ch_1"}` || got.Discarded || got.Upgraded {
		t.Fatalf("DecodeStoredResponse = %+v, %v", got, err)
	}
	gone, err := DecodeStoredResponse((&storedResponse{status: 200, discarded: true}).encode())
	if err != nil || !gone.Discarded || len(gone.Body) != 0 {
		t.Fatalf("discarded = %+v, %v", gone, err)
	}
	for _, bad := range [][]byte{nil, []byte("charged"), []byte("IH\x09\x00\x00\xc8\x00\x00\x00\x00")} {
		if r, err := DecodeStoredResponse(bad); err == nil {
			t.Errorf("DecodeStoredResponse(%q) = %+v, want an error", bad, r)
		}
	}
}

func TestScopeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ principal, method, route string }{
		{"user-42", "POST", "POST /accounts/{account}/payments"},
		{`a "quoted" principal with spaces`, "PUT", "/v1/charges"},
		{"authz-sha256:" + strings.Repeat("ab", 32), "POST", "/pay"},
		{"", "DELETE", ""},
	} {
		s := Scope(c.principal, strings.ToLower(c.method), c.route)
		p, m, r, ok := ParseScope(s)
		if !ok || p != c.principal || m != c.method || r != c.route {
			t.Errorf("ParseScope(Scope(%q, %q, %q) = %q) = %q, %q, %q, %v", c.principal, c.method, c.route, s, p, m, r, ok)
		}
	}
	hashed := Scope(strings.Repeat("x", 1100), "POST", "/pay") // over MaxScopeLen
	if !strings.HasPrefix(hashed, "http sha256:") {
		t.Fatalf("long principal: scope %q", hashed)
	}
	for _, s := range []string{hashed, "payments", `http "unterminated POST /x`, `http "p"POST /x`, `http "p" POST`, `http "p"`, ""} {
		if p, m, r, ok := ParseScope(s); ok {
			t.Errorf("ParseScope(%q) = %q, %q, %q, true; want not ok", s, p, m, r)
		}
	}
}
