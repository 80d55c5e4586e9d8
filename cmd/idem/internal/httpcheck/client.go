package httpcheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-go/idem/retry"
)

// runner sends the checks' requests: rate-limited, within the run's budget,
// to loopback addresses only unless the target is owned.
type runner struct {
	cfg    Config
	target *url.URL
	client *http.Client
	dialer *net.Dialer
	limit  *bucket
	// secrets are the header values that never appear in evidence.
	secrets []string

	// gate, once set, is why every check left is skipped.
	gate string
	// latency is how long the replay check's first request took to be
	// answered: one execution, about.
	latency time.Duration

	sent, budget atomic.Int64
	// slowest is the longest answer seen, in nanoseconds: how long the
	// checks wait for an execution they cannot see to end.
	slowest atomic.Int64
}

// errBudget ends a check that would send more than the run's bound.
var errBudget = errors.New("the run's request budget is spent")

// errLoopbackOnly refuses a connection to an address that is not loopback.
var errLoopbackOnly = errors.New("not a loopback address (the target is not owned)")

func newRunner(cfg Config, target *url.URL) *runner {
	d := &net.Dialer{Timeout: cfg.Timeout}
	if !cfg.AllowRemote {
		// Checked where the connection is made, so that a name resolving
		// elsewhere after the first check cannot redirect the run.
		d.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("connect to %s: %w", address, errLoopbackOnly)
			}
			return nil
		}
	}
	r := &runner{cfg: cfg, target: target, dialer: d, limit: newBucket(cfg.Rate, cfg.Requests)}
	r.budget.Store(int64(cfg.Requests + extraRequests))
	r.client = &http.Client{
		Transport: &http.Transport{
			DialContext: d.DialContext,
			// A fresh connection per request: net/http's Transport re-sends
			// a request carrying an Idempotency-Key by itself when a reused
			// connection breaks, which would blur what the server was sent.
			DisableKeepAlives:      true,
			TLSHandshakeTimeout:    cfg.Timeout,
			ResponseHeaderTimeout:  cfg.Timeout,
			MaxResponseHeaderBytes: 64 << 10,
		},
		// A redirect is an answer to judge, not to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       cfg.Timeout,
	}
	for i, h := range []http.Header{cfg.Header, cfg.PrincipalA, cfg.PrincipalB} {
		for name, vs := range h {
			if i == 0 && !sensitive(name) { // a principal's every header is hidden
				continue
			}
			for _, v := range vs {
				if len(v) >= 4 {
					r.secrets = append(r.secrets, v)
					// and its parts: "Bearer abc" leaks "abc" alone too
					for _, f := range strings.Fields(v) {
						if len(f) >= 8 {
							r.secrets = append(r.secrets, f)
						}
					}
				}
			}
		}
	}
	return r
}

// sensitive reports whether a request header's value must never be shown.
func sensitive(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie":
		return true
	}
	for _, s := range []string{"token", "secret", "api-key", "apikey", "auth", "session", "password"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// redact replaces every secret in s.
func (r *runner) redact(s string) string {
	for _, v := range r.secrets {
		s = strings.ReplaceAll(s, v, "[redacted]")
	}
	return s
}

// response is one answer, or the error that stood for it.
type response struct {
	status int
	header http.Header
	body   []byte
	err    error
	// sent is when the request was handed to the client, at when the
	// answer's head arrived.
	sent, at time.Time
}

func (a response) replayed(marker string) bool {
	return strings.EqualFold(strings.TrimSpace(a.header.Get(marker)), "true")
}

func (a response) ok() bool { return a.err == nil && a.status >= 200 && a.status < 300 }

// inFlight reports a refusal of a key whose first request still runs.
func (a response) inFlight() bool { return a.err == nil && a.status == http.StatusConflict }

// request is what one request of a check sends.
type request struct {
	key    string // "" : no key header
	noKey  bool   // send no key header at all (key == "" sends an empty one)
	body   []byte
	header http.Header // set over the run's headers
}

// newKey returns a fresh key "idem-verify-<check>-<16 hex digits>".
func newKey(check string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idem-verify-" + strings.ReplaceAll(check, " ", "-") + "-" + hex.EncodeToString(b[:])
}

// build makes the http.Request of q.
func (r *runner) build(ctx context.Context, q request) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, r.cfg.Method, r.cfg.URL, bytes.NewReader(q.body))
	if err != nil {
		return nil, err
	}
	if req.Header = r.cfg.Header.Clone(); req.Header == nil {
		req.Header = http.Header{}
	}
	for name, vs := range q.header {
		req.Header[http.CanonicalHeaderKey(name)] = append([]string(nil), vs...)
	}
	if !q.noKey {
		// Set directly: the value may be empty or outside ASCII on purpose.
		req.Header[http.CanonicalHeaderKey(r.cfg.KeyHeader)] = []string{q.key}
	}
	return req, nil
}

// take spends one request of the budget and waits for the rate limit.
func (r *runner) take(ctx context.Context) error {
	if r.budget.Add(-1) < 0 {
		return errBudget
	}
	if err := r.limit.wait(ctx); err != nil {
		return err
	}
	r.sent.Add(1)
	return nil
}

// do sends q and reads its answer (up to MaxBodyBytes of body).
func (r *runner) do(ctx context.Context, q request) response {
	if err := r.take(ctx); err != nil {
		return response{err: err}
	}
	return r.send(ctx, q)
}

// send is do once the request was taken from the budget and rate.
func (r *runner) send(ctx context.Context, q request) response {
	req, err := r.build(ctx, q)
	if err != nil {
		return response{err: err}
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		return response{err: r.cleanErr(err), sent: start}
	}
	defer resp.Body.Close()
	a := response{status: resp.StatusCode, header: resp.Header, sent: start, at: time.Now()}
	a.body, a.err = io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes))
	if a.err != nil {
		a.err = fmt.Errorf("read the answer's body: %w", r.cleanErr(a.err))
	}
	if took := time.Since(start); int64(took) > r.slowest.Load() {
		r.slowest.Store(int64(took))
	}
	return a
}

// cleanErr strips the URL net/http puts in front of its errors (the
// evidence names the target once).
func (r *runner) cleanErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// answered sends q until its answer is not a 409 "in flight", waiting as
// each Retry-After says (at least 50 ms, at most 2 s at a time, 30 s in
// all). It returns the last answer and the number of 409s before it.
func (r *runner) answered(ctx context.Context, q request) (response, int) {
	deadline := time.Now().Add(30 * time.Second)
	conflicts := 0
	for {
		a := r.do(ctx, q)
		if !a.inFlight() || time.Now().After(deadline) {
			return a, conflicts
		}
		conflicts++
		d, ok := retryAfter(a.header)
		if !ok {
			d = 100 * time.Millisecond
		}
		if err := retry.Sleep(ctx, min(max(d, 50*time.Millisecond), 2*time.Second)); err != nil {
			return response{err: err}, conflicts
		}
	}
}

// settle waits long enough for an execution the run cannot see (of a cut
// request, of a request the server kept running) to end: three times the
// slowest answer so far, 200 ms to 5 s.
func (r *runner) settle(ctx context.Context) error {
	return retry.Sleep(ctx, min(max(3*time.Duration(r.slowest.Load()), 200*time.Millisecond), 5*time.Second))
}

// cut sends q on a connection of its own and closes the connection as soon
// as the request's last byte is written, without reading anything.
// With a hold, it waits that long first (without reading), so that the
// server is likely to have started the request when the connection goes.
func (r *runner) cut(ctx context.Context, q request, hold time.Duration) error {
	if err := r.take(ctx); err != nil {
		return err
	}
	req, err := r.build(ctx, q)
	if err != nil {
		return err
	}
	conn, err := r.dialer.DialContext(ctx, "tcp", r.addr())
	if err != nil {
		return err
	}
	if r.target.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: r.target.Hostname(), MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return err
		}
		conn = tc
	}
	_ = conn.SetWriteDeadline(time.Now().Add(r.cfg.Timeout))
	req.Close = true
	err = req.Write(conn)
	if err == nil && hold > 0 {
		err = retry.Sleep(ctx, hold)
	}
	if cerr := conn.Close(); err == nil {
		err = cerr
	}
	return err
}

// count reads the server's execution count; ok is false without a count
// URL.
func (r *runner) count(ctx context.Context) (n int64, ok bool, err error) {
	if r.cfg.CountURL == "" {
		return 0, false, nil
	}
	if err := r.take(ctx); err != nil {
		return 0, true, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.cfg.CountURL, nil)
	if err != nil {
		return 0, true, err
	}
	req.Header = r.cfg.Header.Clone()
	req.Header.Del("Content-Type")
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, true, fmt.Errorf("count URL: %w", r.cleanErr(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes))
	if err != nil {
		return 0, true, fmt.Errorf("count URL: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, true, fmt.Errorf("count URL answered %d %s", resp.StatusCode, r.excerpt(b))
	}
	v := json.RawMessage(bytes.TrimSpace(b))
	if r.cfg.CountPointer != "" {
		var found bool
		if v, found = pointer(b, r.cfg.CountPointer); !found {
			return 0, true, fmt.Errorf("count URL: no %s in %s", r.cfg.CountPointer, r.excerpt(b))
		}
	}
	n, err = strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("count URL: %s is not a whole number (give the count pointer of a JSON answer)", r.excerpt(v))
	}
	return n, true, nil
}

// same is the value at Config.Same in a's body, as compact JSON; ok is
// false without the pointer or when the body has no value there.
func (r *runner) same(a response) (string, bool) {
	if r.cfg.Same == "" || a.err != nil {
		return "", false
	}
	v, ok := pointer(a.body, r.cfg.Same)
	return string(v), ok
}

// pointer returns the value at the RFC 6901 JSON pointer p in doc.
func pointer(doc []byte, p string) (json.RawMessage, bool) {
	cur := json.RawMessage(doc)
	for _, tok := range strings.Split(p, "/")[1:] {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		var obj map[string]json.RawMessage
		if json.Unmarshal(cur, &obj) == nil && obj != nil {
			v, ok := obj[tok]
			if !ok {
				return nil, false
			}
			cur = v
			continue
		}
		var arr []json.RawMessage
		i, err := strconv.Atoi(tok)
		if json.Unmarshal(cur, &arr) != nil || err != nil || i < 0 || i >= len(arr) {
			return nil, false
		}
		cur = arr[i]
	}
	var buf bytes.Buffer
	if json.Compact(&buf, cur) != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

// excerpt is the start of a body for evidence, on one line, secrets
// redacted: control characters and invalid UTF-8 escaped as Go does,
// quotes left as they are so that JSON reads as JSON.
func (r *runner) excerpt(b []byte) string {
	q := strconv.Quote(r.redact(cut(string(b), 80)))
	return strings.ReplaceAll(q[1:len(q)-1], `\"`, `"`)
}

// cut shortens s to n bytes on a UTF-8 boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// describe is one answer in evidence: "201 \"{...}\"", or the error.
func (r *runner) describe(a response) string {
	if a.err != nil {
		return "error: " + r.redact(a.err.Error())
	}
	s := strconv.Itoa(a.status) + " " + r.excerpt(a.body)
	if a.replayed(r.cfg.ReplayHeader) {
		s += " (" + r.cfg.ReplayHeader + ")"
	}
	return s
}

// retryAfter parses a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(h http.Header) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 31); err == nil {
		return time.Duration(n) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0), true
	}
	return 0, false
}

// bucket is a token bucket: rate tokens a second, at most burst at once.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int) *bucket {
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

func (b *bucket) wait(ctx context.Context) error {
	for {
		b.mu.Lock()
		now := time.Now()
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		b.last = now
		if b.tokens >= 1 {
			b.tokens--
			b.mu.Unlock()
			return nil
		}
		d := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
		b.mu.Unlock()
		if err := retry.Sleep(ctx, d); err != nil {
			return err
		}
	}
}

// addr is the target's host:port.
func (r *runner) addr() string {
	if r.target.Port() != "" {
		return r.target.Host
	}
	return net.JoinHostPort(r.target.Hostname(), map[string]string{"http": "80", "https": "443"}[r.target.Scheme])
}
