package console_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/store/idemsqlite"
)

// inboxTx is the SQLite inbox's transaction type.
type inboxTx = *sql.Tx

// env is a console over a real SQLite store, served by httptest.
type env struct {
	t     *testing.T
	store *idemsqlite.Store
	srv   *httptest.Server
	dlq   *memDLQ
	logs  *syncBuffer
}

// syncBuffer is a bytes.Buffer for a logger written by the server's
// goroutines and read by the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newEnv opens a SQLite store in a temporary directory and serves a
// console over it; edit adjusts the console's Config.
func newEnv(t *testing.T, edit func(*console.Config)) *env {
	t.Helper()
	s, err := idemsqlite.Open(t.Context(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{AutoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e := &env{t: t, store: s, dlq: &memDLQ{name: "memory orders.dlq"}, logs: &syncBuffer{}}
	cfg := console.Config{Store: s, StoreName: "sqlite://test.db", Inbox: s.Inbox(), DeadLetters: []console.DeadLetterQueue{e.dlq},
		Logger: slog.New(slog.NewTextHandler(e.logs, nil))}
	if edit != nil {
		edit(&cfg)
	}
	srv, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(srv)
	t.Cleanup(e.srv.Close)
	return e
}

// client is a browser-like client: a cookie jar, no redirects followed.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
	// bearer, when set, is sent as Authorization: Bearer.
	bearer string
}

func (e *env) client() *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: e.t, base: e.srv.URL, hc: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type resp struct {
	code     int
	body     string
	header   http.Header
	location string
}

func (c *client) do(req *http.Request) resp {
	c.t.Helper()
	if c.bearer != "" {
		req.Header.Set("Authorization", "Bearer "+c.bearer)
	}
	r, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{code: r.StatusCode, body: string(b), header: r.Header, location: r.Header.Get("Location")}
}

func (c *client) get(path string) resp {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, c.base+path, nil)
	return c.do(req)
}

// csrf is the CSRF cookie the console gave this client (after a GET).
func (c *client) csrf() string {
	u, _ := url.Parse(c.base)
	for _, ck := range c.hc.Jar.Cookies(u) {
		if ck.Name == "idem_console_csrf" {
			return ck.Value
		}
	}
	return ""
}

// post submits form as the console's own page would: with the CSRF token
// (fetched by a GET of / first if the client has none) and its Origin.
func (c *client) post(path string, form url.Values) resp {
	c.t.Helper()
	if c.csrf() == "" {
		c.get("/login")
	}
	if form == nil {
		form = url.Values{}
	}
	if !form.Has("csrf") {
		form.Set("csrf", c.csrf())
	}
	return c.postRaw(path, form, c.base)
}

// postRaw submits form as is, with origin as its Origin header (none when
// empty).
func (c *client) postRaw(path string, form url.Values, origin string) resp {
	c.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	return c.do(req)
}

func wantCode(t *testing.T, r resp, code int, contains ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("status %d, want %d; body:\n%s", r.code, code, cutBody(r.body))
	}
	for _, s := range contains {
		if !strings.Contains(r.body, s) {
			t.Fatalf("the page lacks %q:\n%s", s, cutBody(r.body))
		}
	}
}

func cutBody(s string) string {
	if len(s) > 4000 {
		return s[:4000] + "…"
	}
	return s
}

// storeHTTP stores a response through the real idemhttp middleware: POST
// route with key by principal, answered by a handler that also sets a
// cookie (which the middleware never stores).
func storeHTTP(t *testing.T, s idem.Store, principal, key, body string) {
	t.Helper()
	mw, err := idemhttp.New(s, &idemhttp.Config{Principal: idemhttp.PrincipalFromHeader("X-User")})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "cookie-secret"})
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-"+key)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, body)
	}))
	req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-User", principal)
	req.Header.Set("Authorization", "Bearer client-secret")
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		t.Fatalf("the middleware answered %d: %s", rec.Code, rec.Body)
	}
}

// complete stores a completed record of the lease path with result.
func complete(t *testing.T, s idem.Store, scope, key string, result []byte) {
	t.Helper()
	c, err := s.Claim(t.Context(), idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: idem.Fingerprint{1}, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(t.Context(), idem.CompleteRequest{Scope: scope, Key: key, Token: c.Token, Result: result, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
}

// encodeStored encodes a stored HTTP response in idemhttp's documented
// format (response.go), to store what the middleware never would.
func encodeStored(status int, headers [][2]string, body string) []byte {
	b := []byte{'I', 'H', 1, 0}
	b = binary.BigEndian.AppendUint16(b, uint16(status))
	b = binary.BigEndian.AppendUint16(b, uint16(len(headers)))
	for _, h := range headers {
		b = binary.BigEndian.AppendUint16(b, uint16(len(h[0])))
		b = append(b, h[0]...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(h[1])))
		b = append(b, h[1]...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// seedInbox receives messages of type typ into s's inbox and runs a
// worker over them whose handler fails them all: they end dead after one
// attempt. It returns their row ids.
func seedDead(t *testing.T, s *idemsqlite.Store, n int) []int64 {
	t.Helper()
	ib := s.Inbox()
	for i := range n {
		m := inbox.Message{Source: "orders", ID: fmt.Sprintf("order-%03d", i), Type: "charge", Payload: []byte(fmt.Sprintf(`{"order":%d}`, i))}
		if _, err := ib.Receive(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	runInbox(t, s, func(context.Context, inbox.Message) error { return errors.New("card declined") })
	rows, err := ib.List(t.Context(), inbox.ListRequest{State: inbox.StateDead, Limit: inbox.MaxBatch})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	return ids
}

// runInbox runs a worker with handler h over s's inbox until nothing is
// pending or running.
func runInbox(t *testing.T, s *idemsqlite.Store, h func(context.Context, inbox.Message) error) {
	t.Helper()
	ib := s.Inbox()
	w, err := inbox.NewWorker(ib, &inbox.Config{Workers: 1, PurgeInterval: -1,
		Retry: &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("charge", func(ctx context.Context, _ inboxTx, m inbox.Message) error { return h(ctx, m) }); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := w.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		st, err := ib.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		busy := int64(0)
		for _, c := range st {
			if c.State == inbox.StatePending || c.State == inbox.StateRunning {
				busy += c.Count
			}
		}
		if busy == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// memDLQ is a dead-letter queue in memory, standing for a broker in the
// handler tests (the RabbitMQ one is tested in cmd/idem against a real
// server).
type memDLQ struct {
	mu   sync.Mutex
	name string
	msgs []console.DeadLetter
	// redriven lists the ids sent back.
	redriven []string
	err      error
}

func (q *memDLQ) Name() string { return q.name }

func (q *memDLQ) List(_ context.Context, limit int) ([]console.DeadLetter, int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return nil, 0, q.err
	}
	n := min(limit, len(q.msgs))
	out := make([]console.DeadLetter, n)
	for i, m := range q.msgs[:n] {
		m.Headers, m.Body = nil, nil
		out[i] = m
	}
	return out, len(q.msgs), nil
}

func (q *memDLQ) Get(_ context.Context, id string, limit int) (console.DeadLetter, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, m := range q.msgs[:min(limit, len(q.msgs))] {
		if m.ID == id {
			return m, nil
		}
	}
	return console.DeadLetter{}, fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
}

func (q *memDLQ) Redrive(_ context.Context, ids []string) (console.RedriveResult, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var res console.RedriveResult
	for _, id := range ids {
		i := slices.IndexFunc(q.msgs, func(m console.DeadLetter) bool { return m.ID == id })
		if i < 0 {
			res.Missing = append(res.Missing, id)
			continue
		}
		q.msgs = slices.Delete(q.msgs, i, i+1)
		q.redriven = append(q.redriven, id)
		res.Redriven = append(res.Redriven, id)
	}
	return res, nil
}

func (q *memDLQ) add(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range n {
		q.msgs = append(q.msgs, console.DeadLetter{ID: fmt.Sprintf("msg-%03d", i), Reason: "max_attempts", Attempts: 3,
			LastError: "boom <script>alert(1)</script>", Consumer: "billing", Origin: "orders", Copies: 1, BodyBytes: 7,
			Headers: []console.Header{{"x-idem-reason", "max_attempts"}}, Body: []byte("payload")})
	}
}
