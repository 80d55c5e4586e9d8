package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/inbox"
)

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:8090", "", true},
		{"[::1]:8090", "", true},
		{"localhost:8090", "", true},
		{"0.0.0.0:8090", "", false},
		{":8090", "", false},
		{"10.1.2.3:8090", "", false},
		{"0.0.0.0:8090", "s3cret", true},
		{"nonsense", "s3cret", false},
	} {
		err := console.CheckListen(tc.addr, tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, token %v) = %v, want ok %v", tc.addr, tc.token != "", err, tc.ok)
		}
		if err != nil && tc.token == "" && !strings.Contains(err.Error(), "--token") && tc.addr != "nonsense" {
			t.Errorf("the error does not say what to do: %v", err)
		}
	}
}

func TestNewNeedsAStore(t *testing.T) {
	t.Parallel()
	if _, err := console.New(console.Config{}); err == nil {
		t.Fatal("New without a store succeeded")
	}
}

// TestSecurityHeaders: every response, pages, errors and assets alike,
// carries the strict CSP and the other headers.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := e.client()
	for _, path := range []string{"/", "/keys", "/inbox", "/dlq/list?q=0", "/static/app.css", "/static/app.js", "/nope", "/keys?limit=0"} {
		r := c.get(path)
		csp := r.header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "form-action 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s: CSP %q lacks %q", path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("%s: CSP allows inline code: %q", path, csp)
		}
		for h, want := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
			"Referrer-Policy": "same-origin", "Cache-Control": "no-store"} {
			if got := r.header.Get(h); got != want {
				t.Errorf("%s: %s = %q, want %q", path, h, got, want)
			}
		}
		if strings.HasSuffix(path, ".html") || r.header.Get("Content-Type") == "text/html; charset=utf-8" {
			if strings.Contains(r.body, "<script>") || strings.Contains(r.body, " style=") || strings.Contains(r.body, "<style") {
				t.Errorf("%s: inline script or style in the page", path)
			}
		}
	}
	for _, ck := range c.hc.Jar.Cookies(mustURL(e.srv.URL)) {
		if ck.Name == "idem_console_csrf" && len(ck.Value) != 64 {
			t.Errorf("csrf cookie %q", ck.Value)
		}
	}
	r := c.get("/")
	for _, sc := range r.header.Values("Set-Cookie") {
		t.Errorf("a second GET set a cookie again: %s", sc)
	}
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

// TestAuth: with a token, every page and action needs it (bearer or the
// login form's cookie); the cookie is HttpOnly and SameSite=Strict;
// failures are logged, the token never is.
func TestAuth(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token-value"
	e := newEnv(t, func(c *console.Config) { c.Token = token })
	ids := seedDead(t, e.store, 1)
	anon := e.client()
	for _, path := range []string{"/", "/keys?key=k", "/keys/record?scope=&key=k", "/inbox", "/inbox/row?id=1", "/dlq", "/dlq/list?q=0"} {
		r := anon.get(path)
		wantCode(t, r, http.StatusUnauthorized, `name="token"`)
		if r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without WWW-Authenticate", path)
		}
	}
	// The assets need no token: the login page uses them.
	wantCode(t, anon.get("/static/app.css"), http.StatusOK)
	// An action without the token is refused and does nothing.
	wantCode(t, anon.post("/inbox/redrive", url.Values{"id": {strconv.FormatInt(ids[0], 10)}}), http.StatusUnauthorized)
	if row, _, _ := e.store.Inbox().Get(t.Context(), ids[0]); row.State != inbox.StateDead {
		t.Fatalf("an unauthenticated redrive moved the row to %s", row.State)
	}

	// Bearer: right and wrong.
	bad := e.client()
	bad.bearer = "wrong"
	wantCode(t, bad.get("/"), http.StatusUnauthorized)
	good := e.client()
	good.bearer = token
	wantCode(t, good.get("/"), http.StatusOK, "Records by state")

	// The login form: a wrong token is a 401, the right one sets the cookie.
	browser := e.client()
	wantCode(t, browser.get("/login?next=/inbox"), http.StatusOK)
	r := browser.post("/login", url.Values{"token": {"nope"}, "next": {"/inbox"}})
	wantCode(t, r, http.StatusUnauthorized, "wrong token")
	r = browser.post("/login", url.Values{"token": {token}, "next": {"/inbox"}})
	if r.code != http.StatusSeeOther || r.location != "/inbox" {
		t.Fatalf("login: %d to %q", r.code, r.location)
	}
	sc := strings.Join(r.header.Values("Set-Cookie"), "\n")
	for _, want := range []string{"idem_console_session=", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(sc, want) {
			t.Fatalf("session cookie lacks %s: %s", want, sc)
		}
	}
	if strings.Contains(sc, token) {
		t.Fatal("the session cookie holds the token itself")
	}
	wantCode(t, browser.get("/inbox"), http.StatusOK, "Log out")
	// A login's next never leaves the console.
	for _, next := range []string{"https://evil.example/", "//evil.example/", `/\evil.example`} {
		r = browser.post("/login", url.Values{"token": {token}, "next": {next}})
		if r.location != "/" {
			t.Errorf("next %q redirected to %q", next, r.location)
		}
	}
	// Logout clears the cookie.
	r = browser.post("/logout", nil)
	if r.code != http.StatusSeeOther || !strings.Contains(strings.Join(r.header.Values("Set-Cookie"), ""), "Max-Age=0") {
		t.Fatalf("logout: %d %v", r.code, r.header.Values("Set-Cookie"))
	}
	wantCode(t, browser.get("/inbox"), http.StatusUnauthorized)

	logs := e.logs.String()
	for _, want := range []string{"not authenticated", "login with a wrong token", "action=login", "action=logout"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, token) {
		t.Fatalf("the log holds the token:\n%s", logs)
	}
}

// TestCSRF: a POST needs the form's token to equal the cookie's and must
// not come from another origin; a refused POST does nothing.
func TestCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ids := seedDead(t, e.store, 1)
	id := strconv.FormatInt(ids[0], 10)
	c := e.client()
	c.get("/")
	for name, r := range map[string]resp{
		"no token":         c.postRaw("/inbox/redrive", url.Values{"id": {id}}, e.srv.URL),
		"wrong token":      c.postRaw("/inbox/redrive", url.Values{"id": {id}, "csrf": {strings.Repeat("0", 64)}}, e.srv.URL),
		"other origin":     c.postRaw("/inbox/redrive", url.Values{"id": {id}, "csrf": {c.csrf()}}, "https://evil.example"),
		"null origin":      c.postRaw("/inbox/redrive", url.Values{"id": {id}, "csrf": {c.csrf()}}, "null"),
		"no cookie at all": e.client().postRaw("/inbox/redrive", url.Values{"id": {id}, "csrf": {c.csrf()}}, e.srv.URL),
		"login":            e.client().postRaw("/login", url.Values{"token": {"x"}}, e.srv.URL),
	} {
		if r.code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, r.code)
		}
	}
	// Sec-Fetch-Site when the browser sends no Origin.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/inbox/redrive", strings.NewReader(url.Values{"id": {id}, "csrf": {c.csrf()}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	wantCode(t, c.do(req), http.StatusForbidden)
	if row, _, _ := e.store.Inbox().Get(t.Context(), ids[0]); row.State != inbox.StateDead {
		t.Fatalf("a refused POST moved the row to %s", row.State)
	}
	if !strings.Contains(e.logs.String(), "CSRF") {
		t.Errorf("refusals not logged:\n%s", e.logs)
	}
	// The same request with the token passes.
	r := c.post("/inbox/redrive", url.Values{"id": {id}})
	if r.code != http.StatusSeeOther {
		t.Fatalf("redrive with the token: %d %s", r.code, r.body)
	}
	// A form body over the bound is refused.
	r = c.post("/inbox/redrive", url.Values{"id": {id}, "pad": {strings.Repeat("x", 70<<10)}})
	wantCode(t, r, http.StatusBadRequest)
}

// TestReadOnly: every action is refused with 403 and does nothing, and
// the pages offer none.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.ReadOnly = true })
	ids := seedDead(t, e.store, 2)
	e.dlq.add(1)
	c := e.client()
	r := c.get(fmt.Sprintf("/inbox/row?id=%d", ids[0]))
	wantCode(t, r, http.StatusOK, "read-only")
	if strings.Contains(r.body, `id="redrive"`) || strings.Contains(r.body, `id="discard"`) {
		t.Fatal("a read-only console shows action buttons")
	}
	if r := c.get("/inbox?state=dead"); strings.Contains(r.body, "redrive-selected") {
		t.Fatal("a read-only inbox list offers redrive")
	}
	if r := c.get("/dlq/message?q=0&id=msg-000"); strings.Contains(r.body, `id="redrive"`) {
		t.Fatal("a read-only dead letter offers redrive")
	}
	id := strconv.FormatInt(ids[0], 10)
	for _, tc := range []struct {
		path string
		form url.Values
	}{
		{"/inbox/redrive", url.Values{"id": {id}}},
		{"/inbox/discard", url.Values{"id": {id}, "confirm": {"yes"}}},
		{"/dlq/redrive", url.Values{"q": {"0"}, "id": {"msg-000"}}},
	} {
		wantCode(t, c.post(tc.path, tc.form), http.StatusForbidden, "read-only")
	}
	st, _ := e.store.Inbox().Stats(t.Context())
	for _, s := range st {
		if s.State == inbox.StateDead && s.Count != 2 {
			t.Fatalf("a read-only console changed the inbox: %+v", st)
		}
	}
	if len(e.dlq.redriven) != 0 {
		t.Fatal("a read-only console redrove a dead letter")
	}
	if !strings.Contains(e.logs.String(), "why=read-only") {
		t.Errorf("refusals not logged:\n%s", e.logs)
	}
}

func TestOverview(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	storeHTTP(t, e.store, "alice", "pay-1", `{"id":"ch_1"}`)
	complete(t, e.store, "billing", "m-1", []byte("ok"))
	if _, err := e.store.Claim(t.Context(), idem.ClaimRequest{Scope: "billing", Key: "m-2", Lease: idem.MinLease}); err != nil {
		t.Fatal(err)
	}
	seedDead(t, e.store, 3)
	e.dlq.add(2)
	r := e.client().get("/")
	wantCode(t, r, http.StatusOK, "Records by state", "All 3 records of the store", `id="created">3<`, `id="completed">2<`,
		"<svg", "Dead letters by reason", "max_attempts", "memory orders.dlq", `id="backlog">0<`, "replays or mismatches")
	if strings.Count(r.body, "<rect") < 4 {
		t.Errorf("charts without bars:\n%s", cutBody(r.body))
	}
	// A broker that fails shows its error and the rest of the page.
	e.dlq.err = errors.New("broker unreachable")
	wantCode(t, e.client().get("/"), http.StatusOK, "broker unreachable", "Records by state")
}

// TestOverviewBounded: the overview reads at most OverviewExamine records
// and says its counts are lower bounds.
func TestOverviewBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.OverviewExamine = 1000 })
	if err := fillSQLite(t.Context(), e.store, "s", 1200); err != nil {
		t.Fatal(err)
	}
	wantCode(t, e.client().get("/"), http.StatusOK, "The first 1000 records", "lower bounds")
	// The time bound: one List call (1000 records) and the page answers.
	quick := newEnv(t, func(c *console.Config) { c.OverviewTime = time.Nanosecond })
	if err := fillSQLite(t.Context(), quick.store, "s", 1200); err != nil {
		t.Fatal(err)
	}
	wantCode(t, quick.client().get("/"), http.StatusOK, "The first 1000 records", "lower bounds")
}

// TestKeySearch: a key stored by the middleware is found by key alone, by
// scope hash and by prefix; its page shows the decoded response and never
// a credential header.
func TestKeySearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	storeHTTP(t, e.store, "alice", "pay-1", `{"id":"ch_1","amount":100}`)
	storeHTTP(t, e.store, "bob", "pay-1", `{"id":"ch_2"}`)
	complete(t, e.store, "billing", "invoice-7", []byte{0, 1, 2, 0xff})
	c := e.client()
	scope := `http "alice" POST /payments`

	r := c.get("/keys?key=pay-1")
	wantCode(t, r, http.StatusOK, `id="results"`, "&#34;alice&#34;", "&#34;bob&#34;")
	if strings.Count(r.body, "/keys/record?") != 2 {
		t.Fatalf("want 2 results:\n%s", cutBody(r.body))
	}
	r = c.get("/keys?scope_hash=" + idem.ScopeHash(scope))
	wantCode(t, r, http.StatusOK, "pay-1")
	if strings.Contains(r.body, "bob") {
		t.Fatal("scope hash search found another scope")
	}
	wantCode(t, c.get("/keys?key_prefix=inv"), http.StatusOK, "invoice-7")
	wantCode(t, c.get("/keys?scope_prefix=http+&state=completed"), http.StatusOK, "pay-1")
	wantCode(t, c.get("/keys?key=nothing"), http.StatusOK, "No record matches")
	// The search form sends every field, empty ones too: a key with an
	// empty scope searches every scope.
	wantCode(t, c.get("/keys?key=pay-1&scope=&scope_hash=&key_prefix=&scope_prefix=&state=&limit=50"), http.StatusOK, "&#34;bob&#34;")
	wantCode(t, c.get("/keys?all=1"), http.StatusOK, "invoice-7", "pay-1")

	// Key and scope: straight to the record.
	r = c.get("/keys?" + url.Values{"key": {"pay-1"}, "scope": {scope}}.Encode())
	if r.code != http.StatusSeeOther || !strings.HasPrefix(r.location, "/keys/record?") {
		t.Fatalf("exact search: %d %q", r.code, r.location)
	}
	r = c.get(r.location)
	wantCode(t, r, http.StatusOK, `id="response-status">201 Created<`, "X-Request-Id", "req-pay-1",
		"{&#34;id&#34;:&#34;ch_1&#34;,&#34;amount&#34;:100}", "alice", idem.ScopeHash(scope))
	for _, secret := range []string{"Set-Cookie", "cookie-secret", "client-secret", "Authorization"} {
		if strings.Contains(r.body, secret) {
			t.Fatalf("the record page shows %q", secret)
		}
	}
	wantCode(t, c.get("/keys?"+url.Values{"key": {"pay-1"}, "scope": {"nope"}}.Encode()), http.StatusNotFound, "search without a scope")

	// A binary result is a hex dump.
	wantCode(t, c.get("/keys/record?scope=billing&key=invoice-7"), http.StatusOK, "binary (hex)", "00 01 02 ff")

	// A stored response that did carry credentials (written by hand: the
	// middleware never stores them) still does not show them.
	complete(t, e.store, `http "eve" POST /x`, "k", encodeStored(200,
		[][2]string{{"Set-Cookie", "sid=leak"}, {"Authorization", "Bearer leak"}, {"Cookie", "a=leak"}, {"Content-Type", "text/plain"}}, "hello"))
	r = c.get("/keys/record?" + url.Values{"scope": {`http "eve" POST /x`}, "key": {"k"}}.Encode())
	wantCode(t, r, http.StatusOK, "200 OK", "text/plain", "hello")
	if strings.Contains(r.body, "leak") {
		t.Fatal("a credential header stored by someone else is shown")
	}
}

// TestKeySearchBounded: a filter that matches nothing in a large store
// stops at SearchExamine and offers to search further, with a cursor that
// goes on where it stopped.
func TestKeySearchBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.SearchExamine = 5000 })
	if err := fillSQLite(t.Context(), e.store, "s", 6000); err != nil {
		t.Fatal(err)
	}
	c := e.client()
	r := c.get("/keys?key=k0005999")
	wantCode(t, r, http.StatusOK, "Search further", "No record matches in the part searched so far")
	i := strings.Index(r.body, `id="next"`)
	if i < 0 {
		t.Fatal("no link to search further")
	}
	next := r.body[strings.LastIndex(r.body[:i], `href="`)+len(`href="`):]
	next = strings.ReplaceAll(next[:strings.Index(next, `"`)], "&amp;", "&")
	wantCode(t, c.get(next), http.StatusOK, "k0005999")

	// The time bound: one List call (5000 records examined) and the page
	// answers, whatever SearchExamine allows.
	quick := newEnv(t, func(c *console.Config) { c.SearchTime = time.Nanosecond })
	if err := fillSQLite(t.Context(), quick.store, "s", 6000); err != nil {
		t.Fatal(err)
	}
	wantCode(t, quick.client().get("/keys?key=k0005999"), http.StatusOK, "Search further", "examining about 5000 records")

	// Pagination: limit=2 pages through.
	r = c.get("/keys?key_prefix=k000000&limit=2")
	wantCode(t, r, http.StatusOK, "k0000000", "k0000001", "Next page")
	if strings.Contains(r.body, "k0000002") {
		t.Fatal("a page of 2 holds a third record")
	}
}

// TestBadInput: every parameter out of its bounds is a 400 with a message,
// and unknown things are 404s.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c := e.client()
	long := strings.Repeat("k", 5000)
	for path, code := range map[string]int{
		"/keys?limit=0":                         http.StatusBadRequest,
		"/keys?limit=201":                       http.StatusBadRequest,
		"/keys?key=k&limit=abc":                 http.StatusBadRequest,
		"/keys?state=done":                      http.StatusBadRequest,
		"/keys?scope_hash=xyz":                  http.StatusBadRequest,
		"/keys?key=" + long:                     http.StatusBadRequest,
		"/keys?key=k%00":                        http.StatusBadRequest,
		"/keys?cursor=garbage":                  http.StatusBadRequest,
		"/keys/record?scope=s&key=":             http.StatusBadRequest,
		"/keys/record?scope=s&key=none":         http.StatusNotFound,
		"/inbox?state=lost":                     http.StatusBadRequest,
		"/inbox?limit=1000":                     http.StatusBadRequest,
		"/inbox?after=-1":                       http.StatusBadRequest,
		"/inbox?after=x":                        http.StatusBadRequest,
		"/inbox/row?id=0":                       http.StatusBadRequest,
		"/inbox/row?id=abc":                     http.StatusBadRequest,
		"/inbox/row?id=999":                     http.StatusNotFound,
		"/dlq/list?q=1":                         http.StatusBadRequest,
		"/dlq/list?q=x":                         http.StatusBadRequest,
		"/dlq/list?q=0&offset=-1":               http.StatusBadRequest,
		"/dlq/list?q=0&offset=1000":             http.StatusBadRequest,
		"/dlq/list?q=0&limit=500":               http.StatusBadRequest,
		"/dlq/message?q=0":                      http.StatusBadRequest,
		"/dlq/message?q=0&id=none":              http.StatusNotFound,
		"/nope":                                 http.StatusNotFound,
		"/keys?key=" + long + long + long:       http.StatusBadRequest,
		"/keys?" + strings.Repeat("a=b&", 5000): http.StatusRequestURITooLong,
	} {
		r := c.get(path)
		if r.code != code {
			t.Errorf("%s: %d, want %d\n%s", cutBody(path), r.code, code, cutBody(r.body))
		}
		if code == http.StatusBadRequest && !strings.Contains(r.body, `id="error"`) {
			t.Errorf("%s: a 400 without a message", cutBody(path))
		}
	}
	for _, tc := range []struct {
		path string
		form url.Values
		code int
	}{
		{"/inbox/redrive", url.Values{}, http.StatusBadRequest},
		{"/inbox/redrive", url.Values{"id": {"x"}}, http.StatusBadRequest},
		{"/inbox/redrive", url.Values{"id": {"-3"}}, http.StatusBadRequest},
		{"/inbox/redrive", url.Values{"id": strings.Split(strings.Repeat("1,", 201)+"1", ",")}, http.StatusBadRequest},
		{"/inbox/discard", url.Values{}, http.StatusBadRequest},
		{"/dlq/redrive", url.Values{"q": {"0"}}, http.StatusBadRequest},
		{"/dlq/redrive", url.Values{"q": {"7"}, "id": {"a"}}, http.StatusBadRequest},
		{"/dlq/redrive", url.Values{"q": {"0"}, "id": {""}}, http.StatusBadRequest},
		{"/dlq/redrive", url.Values{"q": {"0"}, "id": {"absent"}}, http.StatusConflict},
		{"/keys", url.Values{}, http.StatusMethodNotAllowed},
	} {
		if r := c.post(tc.path, tc.form); r.code != tc.code {
			t.Errorf("POST %s %v: %d, want %d\n%s", tc.path, cutBody(tc.form.Encode()), r.code, tc.code, cutBody(r.body))
		}
	}
}

// TestNoInboxNoQueues: a store without an inbox and no broker hide those
// pages (404 with a hint).
func TestNoInboxNoQueues(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.Inbox, c.DeadLetters = nil, nil })
	c := e.client()
	r := c.get("/")
	wantCode(t, r, http.StatusOK)
	if strings.Contains(r.body, `href="/inbox"`) || strings.Contains(r.body, `href="/dlq"`) {
		t.Fatal("the navigation links to absent pages")
	}
	wantCode(t, c.get("/inbox"), http.StatusNotFound, "no inbox")
	wantCode(t, c.get("/dlq/list?q=0"), http.StatusNotFound, "--queue")
	wantCode(t, c.post("/inbox/redrive", url.Values{"id": {"1"}}), http.StatusNotFound)
}

// TestInboxPages: lists by state with pagination, a row with its attempt
// history, redrive (then processed by a worker) and discard after its
// confirmation; each action logged with who did it.
func TestInboxPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ids := seedDead(t, e.store, 5)
	c := e.client()
	r := c.get("/inbox")
	wantCode(t, r, http.StatusOK, "order-000", "order-004", "card declined", "max_attempts", "redrive-selected")
	r = c.get("/inbox?state=dead&limit=2")
	wantCode(t, r, http.StatusOK, "order-000", "order-001", "next page")
	if strings.Contains(r.body, "order-002") {
		t.Fatal("page of 2 holds a third row")
	}
	r = c.get(fmt.Sprintf("/inbox?state=dead&limit=2&after=%d", ids[1]))
	wantCode(t, r, http.StatusOK, "order-002", "order-003")
	r = c.get(fmt.Sprintf("/inbox?state=dead&limit=2&after=%d", ids[3]))
	wantCode(t, r, http.StatusOK, "order-004")
	if strings.Contains(r.body, `id="next"`) {
		t.Fatal("the last page links to a next one")
	}
	wantCode(t, c.get("/inbox?state=pending"), http.StatusOK, "No pending rows")

	row := fmt.Sprintf("/inbox/row?id=%d", ids[0])
	wantCode(t, c.get(row), http.StatusOK, "order-000", `id="history"`, "card declined", `{&#34;order&#34;:0}`, `id="redrive"`)

	// Redrive one, run a worker that now succeeds: processed.
	r = c.post("/inbox/redrive", url.Values{"id": {strconv.FormatInt(ids[0], 10)}})
	if r.code != http.StatusSeeOther || !strings.Contains(r.location, "done=redriven&n=1") {
		t.Fatalf("redrive: %d %q", r.code, r.location)
	}
	wantCode(t, c.get(r.location), http.StatusOK, "Redrove 1 dead message(s)", `id="row-state">pending<`)
	runInbox(t, e.store, func(context.Context, inbox.Message) error { return nil })
	wantCode(t, c.get(row), http.StatusOK, `id="row-state">processed<`)

	// Discard two: first the confirmation page, which deletes nothing.
	two := url.Values{"id": {strconv.FormatInt(ids[1], 10), strconv.FormatInt(ids[2], 10)}}
	r = c.post("/inbox/discard", two)
	wantCode(t, r, http.StatusOK, "Delete 2 dead message(s)", "for good", `name="confirm" value="yes"`, "order-001", "order-002")
	if _, _, err := e.store.Inbox().Get(t.Context(), ids[1]); err != nil {
		t.Fatal("the confirmation page deleted the row")
	}
	two.Set("confirm", "yes")
	r = c.post("/inbox/discard", two)
	if r.code != http.StatusSeeOther {
		t.Fatalf("discard: %d %s", r.code, r.body)
	}
	wantCode(t, c.get(r.location), http.StatusOK, "Discarded 2 dead message(s)")
	if _, _, err := e.store.Inbox().Get(t.Context(), ids[1]); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("discarded row still there: %v", err)
	}
	// A notice is one of the console's own texts, whatever the link says.
	r = c.get("/inbox?done=<b>pwned</b>&n=1")
	if strings.Contains(r.body, "pwned") {
		t.Fatal("the page echoes a notice from the link")
	}
	logs := e.logs.String()
	for _, want := range []string{`action="inbox redrive"`, `action="inbox discard"`, "who=anonymous", "remote=127.0.0.1"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q:\n%s", want, logs)
		}
	}
}

// TestDeadLetterPages: a queue's pages, paged by offset, one message with
// its headers and body (escaped), and redrive.
func TestDeadLetterPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.dlq.add(5)
	c := e.client()
	r := c.get("/dlq")
	if r.code != http.StatusSeeOther || r.location != "/dlq/list?q=0" {
		t.Fatalf("one queue: %d %q", r.code, r.location)
	}
	r = c.get("/dlq/list?q=0&limit=2")
	wantCode(t, r, http.StatusOK, "msg-000", "msg-001", `id="dlq-total">5<`, "next")
	if strings.Contains(r.body, "<script>alert") {
		t.Fatal("an error text is not escaped")
	}
	wantCode(t, c.get("/dlq/list?q=0&limit=2&offset=4"), http.StatusOK, "msg-004")
	wantCode(t, c.get("/dlq/message?q=0&id=msg-003"), http.StatusOK, "x-idem-reason", "payload", "billing")
	r = c.post("/dlq/redrive", url.Values{"q": {"0"}, "id": {"msg-001", "msg-003"}})
	if r.code != http.StatusSeeOther {
		t.Fatalf("redrive: %d %s", r.code, r.body)
	}
	wantCode(t, c.get(r.location), http.StatusOK, "Redrove 2 dead letter(s)", `id="dlq-total">3<`)
	if !strings.Contains(e.logs.String(), `action="dlq redrive"`) {
		t.Errorf("not logged:\n%s", e.logs)
	}
	// Two queues: an index page.
	e2 := newEnv(t, func(c *console.Config) {
		c.DeadLetters = append(c.DeadLetters, &memDLQ{name: "memory second.dlq", err: errors.New("down")})
	})
	wantCode(t, e2.client().get("/dlq"), http.StatusOK, "memory orders.dlq", "memory second.dlq", "down")
}
