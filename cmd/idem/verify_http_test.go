package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/httpcheck"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

// fakeAPI is an Idempotency-Key endpoint written by hand, correct by
// default; each flag breaks it the way real implementations break.
type fakeAPI struct {
	delay time.Duration
	// noDedupe runs every request.
	noDedupe bool
	// markBeforeRun records the key as done before running: a retry during
	// the run gets a replay of nothing.
	markBeforeRun bool
	// mismatchReplays answers a reused key's other body with the replay.
	mismatchReplays bool
	// sharedScope keys records by key alone, not by principal.
	sharedScope bool
	// forgetGone releases the key when the client left during the run.
	forgetGone bool
	// noRetryAfter sends 409 without Retry-After.
	noRetryAfter bool
	// requireKey answers 400 to a request without a key.
	requireKey bool

	execs atomic.Int64
	mu    sync.Mutex
	recs  map[string]*fakeRecord
}

type fakeRecord struct {
	done bool
	body string // the request's
	resp []byte
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/count" {
		fmt.Fprintf(w, `{"executions":%d}`, f.execs.Load())
		return
	}
	body, _ := io.ReadAll(r.Body)
	keys := r.Header.Values("Idempotency-Key")
	run := func() []byte {
		n := f.execs.Add(1)
		time.Sleep(f.delay)
		return fmt.Appendf(nil, `{"id":%d,"request":%q}`, n, body)
	}
	answer := func(b []byte, replay bool) {
		w.Header().Set("Content-Type", "application/json")
		if replay {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	}
	switch {
	case len(keys) == 0 && f.requireKey:
		http.Error(w, "key required", http.StatusBadRequest)
		return
	case len(keys) == 0 || f.noDedupe:
		answer(run(), false)
		return
	case keys[0] == "" || len(keys[0]) > 255 || strings.ContainsFunc(keys[0], func(r rune) bool { return r < 0x20 || r > 0x7e }):
		http.Error(w, "invalid key", http.StatusBadRequest)
		return
	}
	id := r.Header.Get("Authorization") + "\x00" + keys[0]
	if f.sharedScope {
		id = keys[0]
	}
	f.mu.Lock()
	if f.recs == nil {
		f.recs = map[string]*fakeRecord{}
	}
	rec := f.recs[id]
	switch {
	case rec != nil && rec.body != string(body) && !f.mismatchReplays:
		f.mu.Unlock()
		http.Error(w, "key reused", http.StatusUnprocessableEntity)
		return
	case rec != nil && rec.done:
		resp := rec.resp
		f.mu.Unlock()
		answer(resp, true)
		return
	case rec != nil:
		f.mu.Unlock()
		if !f.noRetryAfter {
			w.Header().Set("Retry-After", "0") // retry at once: keeps the tests short
		}
		http.Error(w, "in flight", http.StatusConflict)
		return
	}
	rec = &fakeRecord{body: string(body), done: f.markBeforeRun}
	f.recs[id] = rec
	f.mu.Unlock()
	resp := run()
	f.mu.Lock()
	if f.forgetGone && r.Context().Err() != nil {
		delete(f.recs, id)
		f.mu.Unlock()
		return
	}
	rec.done, rec.resp = true, resp
	f.mu.Unlock()
	answer(resp, false)
}

// verifyHTTPArgs are the arguments every test run passes: a JSON body, a
// principal, the count URL and the execution identity of fakeAPI and
// orderAPI, a rate that keeps the run short.
func verifyHTTPArgs(url, countURL string, extra ...string) []string {
	args := []string{"verify", "http", "--url", url, "--body", `{"sku":"x","qty":1}`,
		"-H", "Authorization: Bearer secret-a-0123456789", "--rate", "300", "--requests", "12",
		"--principal-a", "Authorization: Bearer secret-a-0123456789", "--principal-b", "Authorization: Bearer secret-b-0123456789"}
	if countURL != "" {
		args = append(args, "--count-url", countURL, "--count-pointer", "/executions")
	}
	return append(args, extra...)
}

// checkLine returns the verdict verify http printed for check name.
func checkLine(t *testing.T, out, name string) (verdict, line string) {
	t.Helper()
	m := regexp.MustCompile(`(?m)^(PASS|FAIL|WARN|SKIP) +` + regexp.QuoteMeta(name) + ` +(.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no line for check %q:\n%s", name, out)
	}
	return m[1], m[2]
}

// wantChecks fails unless every check of want printed its verdict, and no
// secret appears in the output.
func wantChecks(t *testing.T, r cliResult, want map[string]string) {
	t.Helper()
	t.Logf("verify http:\n%s", r.Stdout)
	for name, v := range want {
		if got, line := checkLine(t, r.Stdout, name); got != v {
			t.Errorf("check %q: %s, want %s: %s\nstdout:\n%s", name, got, v, line, r.Stdout)
		}
	}
	if strings.Contains(r.Stdout+r.Stderr, "secret-") {
		t.Errorf("the output shows a credential:\n%s%s", r.Stdout, r.Stderr)
	}
}

// allPass is every check PASS, expiry as given.
func allPass(expiry string) map[string]string {
	m := map[string]string{}
	for _, n := range httpcheck.CheckNames() {
		m[n] = "PASS"
	}
	m["expiry"] = expiry
	return m
}

// The hand-written fakeAPI, correct, passes every check: the baseline the
// broken variants below depart from.
func TestVerifyHTTPFakeCorrect(t *testing.T) {
	t.Parallel()
	api := &fakeAPI{delay: 150 * time.Millisecond, requireKey: true}
	srv := httptest.NewServer(api)
	defer srv.Close()
	r := runCLI(t, nil, verifyHTTPArgs(srv.URL+"/orders", srv.URL+"/count", "--require-key", "--same", "/id")...)
	wantExit(t, r, exitOK)
	wantChecks(t, r, allPass("SKIP"))
}

// Each broken behaviour is caught by the check that names it, and the run
// exits 1 naming the failed checks.
func TestVerifyHTTPBroken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		api   *fakeAPI
		count bool
		fails []string
	}{
		{"no dedupe", &fakeAPI{noDedupe: true}, true, []string{"replay", "storm", "in flight", "mismatch", "key limits", "disconnect"}},
		{"no dedupe, bodies only", &fakeAPI{noDedupe: true}, false, []string{"replay", "storm"}},
		{"mark before run", &fakeAPI{markBeforeRun: true}, true, []string{"storm", "in flight"}},
		{"mismatch replays", &fakeAPI{mismatchReplays: true}, true, []string{"mismatch"}},
		{"cross-principal replay", &fakeAPI{sharedScope: true}, true, []string{"scope isolation"}},
		{"re-execution after disconnect", &fakeAPI{forgetGone: true}, true, []string{"disconnect"}},
		{"409 without Retry-After", &fakeAPI{noRetryAfter: true}, true, []string{"in flight", "storm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.api.delay = 200 * time.Millisecond
			srv := httptest.NewServer(tc.api)
			defer srv.Close()
			count := ""
			if tc.count {
				count = srv.URL + "/count"
			}
			r := runCLI(t, nil, verifyHTTPArgs(srv.URL+"/orders", count)...)
			wantExit(t, r, exitFailure, "checks failed", strings.Join(tc.fails[:1], ""), "does not keep the Idempotency-Key contract")
			want := map[string]string{}
			for _, n := range tc.fails {
				want[n] = "FAIL"
			}
			wantChecks(t, r, want)
		})
	}
}

// idem proxy in front of a non-idempotent upstream passes every check,
// expiry included.
func TestVerifyHTTPProxy(t *testing.T) {
	t.Parallel()
	api := &orderAPI{delay: 150 * time.Millisecond}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			fmt.Fprintf(w, `{"executions":%d}`, api.calls.Load())
			return
		}
		api.ServeHTTP(w, r)
	}))
	defer up.Close()
	base, _ := inProcessProxy(t, "--upstream", up.URL, "--store", migratedSQLite(t), "--ttl", "4s", "--require-key")
	r := runCLI(t, nil, verifyHTTPArgs(base+"/orders", up.URL+"/count", "--ttl", "4s", "--require-key", "--same", "/order", "--json")...)
	t.Logf("verify http --json:\n%s", r.Stdout)
	wantExit(t, r, exitOK)
	var rep httpcheck.Report
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("--json: %v\n%s", err, r.Stdout)
	}
	if !rep.Passed || len(rep.Checks) != len(httpcheck.CheckNames()) || rep.Requests == 0 {
		t.Fatalf("report: %+v", rep)
	}
	for _, c := range rep.Checks {
		if c.Result != httpcheck.Pass {
			t.Errorf("check %q: %s: %s", c.Name, c.Result, c.Evidence)
		}
	}
	if strings.Contains(r.Stdout, "secret-") {
		t.Errorf("the report shows a credential:\n%s", r.Stdout)
	}
}

// The idemhttp middleware behind httptest passes every check.
func TestVerifyHTTPMiddleware(t *testing.T) {
	t.Parallel()
	mw, err := idemhttp.New(idemtest.NewMemoryStore(nil), &idemhttp.Config{
		AllowNonDurable: true, RequireKey: true, Principal: idemhttp.PrincipalFromAuthorization()})
	if err != nil {
		t.Fatal(err)
	}
	var execs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := execs.Add(1)
		time.Sleep(150 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, n)
	})))
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, execs.Load()) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	args := verifyHTTPArgs(srv.URL+"/orders", "", "--count-url", srv.URL+"/count", "--require-key", "--same", "/id")
	r := runCLI(t, nil, args...)
	wantExit(t, r, exitOK)
	wantChecks(t, r, allPass("SKIP"))
}

func TestVerifyHTTPErrors(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(&fakeAPI{})
	defer srv.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	bodyFile := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(bodyFile, []byte(`{"a":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	url := srv.URL + "/orders"
	for _, tc := range []struct {
		args  []string
		code  int
		wants []string
	}{
		{[]string{"verify", "http"}, exitUsage, []string{"--url is required"}},
		{[]string{"verify", "http", "--url", "ftp://x"}, exitUsage, []string{"invalid --url"}},
		{[]string{"verify", "http", "--url", closedURL + "/orders"}, exitFailure, []string{"cannot reach", "refused"}},
		{[]string{"verify", "http", "--url", "http://192.0.2.1:8080/orders"}, exitUsage, []string{"--url: 192.0.2.1", "not a loopback address", "--i-own-this-target"}},
		{[]string{"verify", "http", "--url", url, "--count-url", "http://192.0.2.1/count"}, exitUsage, []string{"--count-url: 192.0.2.1", "not a loopback address"}},
		{[]string{"verify", "http", "--url", url, "--body", "{nope"}, exitUsage, []string{"--body", "not valid JSON"}},
		{[]string{"verify", "http", "--url", url, "--body", "@" + filepath.Join(t.TempDir(), "missing.json")}, exitUsage, []string{"--body", "no such file"}},
		{[]string{"verify", "http", "--url", url, "-H", "NoColon"}, exitUsage, []string{"-H", "want Name: value"}},
		{[]string{"verify", "http", "--url", url, "-H", "Bad Name: x"}, exitUsage, []string{"-H", "invalid name"}},
		{[]string{"verify", "http", "--url", url, "-H", "Idempotency-Key: k"}, exitUsage, []string{"set by each check"}},
		{[]string{"verify", "http", "--url", url, "--requests", "1000"}, exitUsage, []string{"--requests must be 2-100"}},
		{[]string{"verify", "http", "--url", url, "--rate", "0.5"}, exitUsage, []string{"--rate must be"}},
		{[]string{"verify", "http", "--url", url, "--ttl", "1h"}, exitUsage, []string{"--ttl must be"}},
		{[]string{"verify", "http", "--url", url, "--count-pointer", "/n"}, exitUsage, []string{"--count-pointer needs --count-url"}},
		{[]string{"verify", "http", "--url", url, "--same", "id"}, exitUsage, []string{"--same", "not a JSON pointer"}},
		{[]string{"verify", "http", "--url", url, "--mismatch-status", "200"}, exitUsage, []string{"--mismatch-status must be a 4xx"}},
		{[]string{"verify", "http", "--url", url, "--principal-a", "Authorization: x"}, exitUsage, []string{"two principals"}},
		{[]string{"verify", "http", "--url", url, "--principal-b", "Authorization Bearer secret-q:x"}, exitUsage, []string{"--principal-b", `header starting "Authorization"`, "invalid name"}},
		{[]string{"verify", "http", "--url", url, "-H", "Authorization Bearer secret-q"}, exitUsage, []string{"-H", `header starting "Authorization"`, "want Name: value"}},
		{[]string{"verify", "http", "--url", url, "--count-url", srv.URL + "/count"}, exitFailure, []string{"count URL", "not a whole number"}},
		{[]string{"verify", "http", "--url", url, "--i-own-this-target", "--body", "@" + bodyFile, "--requests", "1"}, exitUsage, []string{"2-100"}},
	} {
		r := runCLI(t, nil, tc.args...)
		wantExit(t, r, tc.code, tc.wants...)
		if strings.Contains(r.Stderr, "secret-") {
			t.Errorf("%v: the error shows a credential: %s", tc.args, r.Stderr)
		}
	}
	// Every flag has an IDEM_VERIFY_HTTP_* fallback.
	wantExit(t, runCLI(t, map[string]string{"IDEM_VERIFY_HTTP_URL": "http://192.0.2.1/x"}, "verify", "http"), exitUsage, "--url: 192.0.2.1")
	// The confirmation is typed for each run: no environment variable gives it.
	wantExit(t, runCLI(t, map[string]string{"IDEM_VERIFY_HTTP_I_OWN_THIS_TARGET": "true"}, "verify", "http", "--url", "http://192.0.2.1/"),
		exitUsage, "not a loopback address")
	// An endpoint that refuses the request: the first check says why, the
	// others are skipped, nothing else is sent.
	deny := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}))
	defer deny.Close()
	r := runCLI(t, nil, "verify", "http", "--url", deny.URL+"/orders", "-H", "Authorization: Bearer secret-zz-0123456789")
	wantExit(t, r, exitFailure, "1 of 9 checks failed (replay)")
	want := map[string]string{}
	for _, n := range httpcheck.CheckNames() {
		want[n] = "SKIP"
	}
	want["replay"] = "FAIL"
	wantChecks(t, r, want)
	if _, line := checkLine(t, r.Stdout, "replay"); !strings.Contains(line, "401") {
		t.Errorf("replay line lacks the status: %s", line)
	}
	if !strings.Contains(r.Stdout, "; 1 requests") {
		t.Errorf("a refused endpoint got more than one request:\n%s", r.Stdout)
	}
}

// Ctrl-C during a check stops the run: exit 130, the checks done so far
// printed, no further check run.
func TestVerifyHTTPInterrupted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var requests atomic.Int64
	api := &fakeAPI{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 3 { // the storm's first
			cancel()
		}
		api.ServeHTTP(w, r)
	}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	code := runEnv(ctx, []string{"verify", "http", "--url", srv.URL, "--body", `{"a":1}`, "--rate", "300"}, &out, &errOut,
		func(string) string { return "" })
	if code != exitInterrupted || !strings.Contains(errOut.String(), "interrupted") {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	if v, _ := checkLine(t, out.String(), "replay"); v != "PASS" || strings.Contains(out.String(), "storm ") {
		t.Fatalf("stdout:\n%s", out.String())
	}
	// Storm requests already on the wire may still arrive; no check after
	// the storm sends anything.
	time.Sleep(300 * time.Millisecond)
	if n := requests.Load(); n > 2+httpcheck.DefaultRequests {
		t.Fatalf("%d requests reached the server, want at most the replay check's 2 and the storm's %d", n, httpcheck.DefaultRequests)
	}
}
