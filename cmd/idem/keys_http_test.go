package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/store/idemsqlite"
)

// TestKeysGetDecodesHTTP: what the HTTP middleware stored for a key reads
// back as the response a retry is replayed, with the scope's parts and the
// hash the proxy's log prints; a Guard result reads as text or hex.
func TestKeysGetDecodesHTTP(t *testing.T) {
	t.Parallel()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	s, err := idemsqlite.Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	mw, err := idemhttp.New(s, &idemhttp.Config{Principal: idemhttp.PrincipalFromHeader("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /pay", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=secret")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charge":"ch_1"}`))
	})))
	req := httptest.NewRequest("POST", "/pay", strings.NewReader(`{"amount":5}`))
	req.Header.Set("Idempotency-Key", "order-7")
	req.Header.Set("X-User", "alice")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("request: %d %s", rec.Code, rec.Body)
	}

	scope := idemhttp.Scope("alice", "POST", "POST /pay")
	r := runCLI(t, nil, "keys", "get", "--store", dsn, "--scope", scope, "order-7")
	wantExit(t, r, exitOK)
	for _, w := range []string{"stored HTTP response (replayed to a retry):\n201 Created\n", "Content-Type: application/json",
		"body (text):\n{\"charge\":\"ch_1\"}\n", `http principal  "alice"`, "http method     POST", "http route      POST /pay",
		"scope hash      " + idem.ScopeHash(scope)} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("keys get lacks %q:\n%s", w, r.Stdout)
		}
	}
	if strings.Contains(r.Stdout, "secret") {
		t.Errorf("Set-Cookie was stored:\n%s", r.Stdout)
	}
	r = runCLI(t, nil, "keys", "get", "--json", "--store", dsn, "--scope", scope, "order-7")
	wantExit(t, r, exitOK)
	var j recordJSON
	if err := json.Unmarshal([]byte(r.Stdout), &j); err != nil || j.HTTPResponse == nil || j.HTTPResponse.Status != 201 ||
		j.HTTPResponse.Body == nil || *j.HTTPResponse.Body != `{"charge":"ch_1"}` || j.HTTPScope == nil ||
		j.HTTPScope.Principal != "alice" || j.HTTPScope.Hash != idem.ScopeHash(scope) || j.ResultText != nil {
		t.Fatalf("keys get --json = %+v, %v\n%s", j, err, r.Stdout)
	}

	// A Guard's result: text, bounded by --result-bytes; binary as hex.
	seedRecord(t, s, "payments", "g-1", []byte("receipt 123 for order 7"), time.Hour)
	seedRecord(t, s, "payments", "g-2", []byte{0x00, 0xff, 0x10}, time.Hour)
	r = runCLI(t, nil, "keys", "get", "--store", dsn, "--scope", "payments", "--result-bytes", "7", "g-1")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "result (text):\nreceipt\n… 16 more bytes (--result-bytes 0 shows all)") || strings.Contains(r.Stdout, "http ") {
		t.Errorf("keys get of a Guard result:\n%s", r.Stdout)
	}
	r = runCLI(t, nil, "keys", "get", "--store", dsn, "--scope", "payments", "g-2")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "result (binary, hex):\n00000000  00 ff 10") {
		t.Errorf("keys get of a binary result:\n%s", r.Stdout)
	}
	r = runCLI(t, nil, "keys", "get", "--json", "--store", dsn, "--scope", "payments", "g-1")
	j = recordJSON{}
	if err := json.Unmarshal([]byte(r.Stdout), &j); err != nil || j.ResultText == nil || *j.ResultText != "receipt 123 for order 7" || j.HTTPResponse != nil {
		t.Fatalf("keys get --json of a Guard result = %+v, %v", j, err)
	}
}
