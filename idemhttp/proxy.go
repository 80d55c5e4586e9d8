package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// InDoubt says what the proxy does when its upstream received a request and
// then did not answer: it timed out, closed the connection or broke off its
// response. The upstream may or may not have executed the request.
type InDoubt string

const (
	// InDoubtRecord (the default) records an outcome-unknown answer (502,
	// or 504 after a timeout, type [TypeOutcomeUnknown]) for the key and
	// replays it to every retry: the request is never forwarded twice.
	// Someone who knows the upstream's state resolves the key (idem keys
	// delete, then a retry runs again), or the retention does.
	InDoubtRecord InDoubt = "record"
	// InDoubtRelease releases the key, so the client's retry is forwarded
	// again: at-least-once. Only for upstreams that deduplicate by the
	// forwarded Idempotency-Key themselves.
	InDoubtRelease InDoubt = "release"
)

// ProxyConfig configures [NewProxy]. A nil *ProxyConfig means the defaults.
type ProxyConfig struct {
	// Transport carries requests to the upstream. Default: a clone of
	// http.DefaultTransport with ResponseHeaderTimeout set to Timeout and
	// up to 100 idle connections kept for the upstream (net/http keeps 2
	// per host, so a proxy serving more concurrent requests than that
	// would open and close a connection for nearly every request).
	Transport http.RoundTripper
	// Timeout bounds the wait for the upstream's response headers once the
	// request is sent; past it the request's outcome is in doubt (see
	// InDoubt). Zero means no bound. Ignored when Transport is set.
	Timeout time.Duration
	// UpstreamTimeout bounds a whole upstream exchange, from forwarding to
	// the response's last byte; it runs on a context that the client going
	// away does not end. Zero means no bound.
	UpstreamTimeout time.Duration
	// InDoubt is what happens when the upstream received a request and did
	// not answer. Default InDoubtRecord.
	InDoubt InDoubt
	// BodyReadTimeout, when positive, is the deadline for reading a
	// request's body, from the moment its handling starts: a client that
	// trickles its body gets 408 (covered requests) or a broken request
	// (pass-through). The deadline is lifted once the body is read, so it
	// never cuts a slow upstream.
	BodyReadTimeout time.Duration
	// PreserveHeaders are request headers forwarded as received even when
	// the client lists them in its Connection header (which otherwise
	// strips them): the scope header of a gateway, so that the upstream
	// sees the principal the key was scoped by. The Idempotency-Key header
	// is always preserved.
	PreserveHeaders []string
	// Logger receives upstream errors. Default slog.Default().
	Logger *slog.Logger
}

// forwardState tracks whether a request may have reached the upstream.
type forwardState struct {
	// headers is set once the transport has begun writing the request.
	headers atomic.Bool
	// conn is the connection the request went out on, when the proxy's own
	// transport counts what it writes, and base what it had written before.
	conn atomic.Pointer[countingConn]
	base atomic.Int64
}

// sent reports whether any of the request may have left the proxy. With
// the proxy's own transport it knows whether the kernel accepted a byte of
// it; with a Transport of the caller's it knows only whether writing began.
func (st *forwardState) sent() bool {
	if c := st.conn.Load(); c != nil {
		return c.written.Load() > st.base.Load()
	}
	return st.headers.Load()
}

// countingConn counts the bytes written to a connection to the upstream.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

type forwardStateKey struct{}

// NewProxy returns a reverse proxy to upstream with mw applied to every
// request.
//
// The client's Idempotency-Key header reaches the upstream unchanged, so an
// idempotent upstream can deduplicate as well; a client-supplied
// Idempotent-Replayed header is stripped so the upstream cannot be misled.
// Hop-by-hop headers are removed in both directions (but the key and
// PreserveHeaders survive a Connection header that names them) and
// X-Forwarded-* headers are set.
//
// A request is forwarded at most once per key. The upstream call runs on a
// context the client's disconnect does not end; its response is recorded
// and replayed to the client's retry. Only a request that never reached the
// upstream (connection refused, DNS, a dial timeout) releases its key: the
// client gets 502 (504 for a timeout) and a retry is forwarded again. One
// that reached it and got no answer is in doubt (see [InDoubt]). The
// transport is kept from re-sending a request on its own after a broken
// keep-alive connection, which net/http otherwise does for requests that
// carry an Idempotency-Key.
func NewProxy(upstream *url.URL, mw *Middleware, cfg *ProxyConfig) (http.Handler, error) {
	if upstream == nil || upstream.Scheme == "" || upstream.Host == "" {
		return nil, fmt.Errorf("idemhttp: %w: upstream must be an absolute URL", idem.ErrInvalidConfig)
	}
	if mw == nil {
		return nil, fmt.Errorf("idemhttp: %w: nil middleware", idem.ErrInvalidConfig)
	}
	var c ProxyConfig
	if cfg != nil {
		c = *cfg
	}
	switch c.InDoubt {
	case "":
		c.InDoubt = InDoubtRecord
	case InDoubtRecord, InDoubtRelease:
	default:
		return nil, fmt.Errorf("idemhttp: %w: unknown InDoubt %q (want %q or %q)", idem.ErrInvalidConfig, c.InDoubt, InDoubtRecord, InDoubtRelease)
	}
	if c.Timeout < 0 || c.UpstreamTimeout < 0 || c.BodyReadTimeout < 0 {
		return nil, fmt.Errorf("idemhttp: %w: proxy timeouts must not be negative", idem.ErrInvalidConfig)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = c.Timeout
		// One upstream: it may keep every idle connection.
		t.MaxIdleConnsPerHost = t.MaxIdleConns
		// Count what goes out, so that a request the kernel took none of
		// (the upstream reset the connection first) is known not to have
		// been sent.
		dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: conn}, nil
		}
		c.Transport = t
	}
	preserve := []string{mw.header}
	for _, h := range c.PreserveHeaders {
		preserve = append(preserve, http.CanonicalHeaderKey(h))
	}
	p := &proxy{cfg: c, mw: mw, upstream: upstream}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			pr.Out.Header.Del(ReplayedHeader)
			for _, h := range preserve {
				if vs := pr.In.Header.Values(h); len(vs) > 0 {
					pr.Out.Header[h] = slices.Clone(vs)
				}
			}
			// net/http's Transport re-sends a request that carries
			// Idempotency-Key (or X-Idempotency-Key) by itself when a reused
			// connection breaks after the request was written, which would
			// run the upstream twice. It recognises them only under their
			// canonical names; under the lower-case name the header goes out
			// the same (field names are case-insensitive) and the request is
			// not re-sent.
			for _, h := range []string{mw.header, "Idempotency-Key", "X-Idempotency-Key"} {
				if vs, ok := pr.Out.Header[h]; ok {
					delete(pr.Out.Header, h)
					pr.Out.Header[strings.ToLower(h)] = vs
				}
			}
			st := &forwardState{}
			ctx := context.WithValue(pr.Out.Context(), forwardStateKey{}, st)
			ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) {
					if cc, ok := info.Conn.(*countingConn); ok {
						// What it wrote before (a TLS handshake, earlier
						// requests) is not this request.
						st.base.Store(cc.written.Load())
						st.conn.Store(cc)
					}
				},
				WroteHeaderField: func(string, []string) { st.headers.Store(true) },
				WroteHeaders:     func() { st.headers.Store(true) },
			})
			pr.Out = pr.Out.WithContext(ctx)
		},
		Transport: c.Transport,
		// FlushInterval stays 0: ReverseProxy still flushes event streams
		// and responses of unknown length at once, and every other
		// response is recorded before the client sees it.
		ErrorHandler: p.upstreamFailed,
		ErrorLog:     slog.NewLogLogger(c.Logger.Handler(), slog.LevelWarn),
	}
	var h http.Handler = mw.Handler(http.HandlerFunc(p.forward))
	if c.BodyReadTimeout > 0 {
		h = bodyDeadline(h, c.BodyReadTimeout)
	}
	return h, nil
}

type proxy struct {
	cfg      ProxyConfig
	mw       *Middleware
	upstream *url.URL
	rp       *httputil.ReverseProxy
}

// forward sends r upstream. For a covered request it runs under the
// middleware, on a context the client's disconnect does not end.
func (p *proxy) forward(w http.ResponseWriter, r *http.Request) {
	if p.cfg.UpstreamTimeout > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), p.cfg.UpstreamTimeout)
		defer cancel()
		r = r.WithContext(ctx)
	}
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		cw := capture(w)
		if v != http.ErrAbortHandler || cw == nil {
			panic(v)
		}
		// ReverseProxy aborts when the upstream's response breaks off
		// (writes to a client that left never fail: captureWriter absorbs
		// them). The upstream answered, so the request reached it.
		p.inDoubt(cw, r, errors.New("the upstream's response broke off"), false)
	}()
	p.rp.ServeHTTP(w, r)
}

// upstreamFailed is the ReverseProxy's ErrorHandler: the upstream could not
// be reached, or did not answer.
func (p *proxy) upstreamFailed(w http.ResponseWriter, out *http.Request, err error) {
	st, _ := out.Context().Value(forwardStateKey{}).(*forwardState)
	timeout := isTimeout(err)
	sent := st == nil || st.sent()
	p.cfg.Logger.Warn("idemhttp: upstream request failed", "upstream", p.upstream.Redacted(),
		"forwarded", sent, "err", err)
	if !sent {
		// Nothing was sent: whatever the storage policy, release the key so
		// that a retry is forwarded.
		Release(w)
		prob := newProblem(http.StatusBadGateway, TypeUpstreamUnreachable, "Upstream unreachable", nil)
		if timeout {
			prob = newProblem(http.StatusGatewayTimeout, TypeUpstreamTimeout, "Upstream timed out", nil)
		}
		prob.Detail, prob.Err = "the request could not be forwarded; it was not recorded and may be retried", err
		p.mw.errorFunc(w, out, prob)
		return
	}
	cw := capture(w)
	if cw == nil {
		// A pass-through request: nothing is recorded for it.
		status := http.StatusBadGateway
		if timeout {
			status = http.StatusGatewayTimeout
		}
		prob := newProblem(status, TypeOutcomeUnknown, "Upstream outcome unknown", nil)
		prob.Detail, prob.Err = "the request reached the upstream, which did not answer", err
		p.mw.errorFunc(w, out, prob)
		return
	}
	reason := "the upstream did not answer"
	if timeout {
		reason = "the upstream did not answer in time"
	}
	p.inDoubt(cw, out, fmt.Errorf("%s: %w", reason, err), timeout)
}

// inDoubt answers a request that reached the upstream and got no whole
// answer, and records that answer or releases the key per InDoubt.
func (p *proxy) inDoubt(cw *captureWriter, r *http.Request, cause error, timeout bool) {
	cw.inDoubt = true
	status := http.StatusBadGateway
	if timeout {
		status = http.StatusGatewayTimeout
	}
	prob := newProblem(status, TypeOutcomeUnknown, "Upstream outcome unknown", nil)
	prob.Err = cause
	if p.cfg.InDoubt == InDoubtRelease {
		cw.release, cw.keep = true, false
		prob.Detail = cause.Error() + "; it may or may not have executed the request. The key was released: a retry is forwarded again."
	} else {
		cw.keep, cw.release = true, false
		prob.Detail = cause.Error() + "; it may or may not have executed the request. This answer is recorded for the key and " +
			"replayed to every retry, which is not forwarded again; check the upstream's state before using a new key."
	}
	if !cw.streaming {
		// Nothing reached the client yet: the answer replaces whatever
		// the upstream had begun.
		h := cw.rw.Header()
		for k := range h {
			if k != cw.m.header {
				delete(h, k)
			}
		}
		cw.status, cw.header = 0, nil
		cw.body.Reset()
		p.mw.errorFunc(cw, r, prob)
		return
	}
	// Part of the upstream's response is already with the client: record
	// the outcome-unknown answer and then break the client's connection.
	// With InDoubtRelease nothing is recorded: record() prefers stored to
	// release, so setting it would keep the key instead of releasing it.
	cw.abort = true
	if p.cfg.InDoubt == InDoubtRelease {
		return
	}
	rec := recorder{header: http.Header{}}
	p.mw.errorFunc(&rec, r, prob)
	cw.stored = &storedResponse{status: rec.status, header: cw.m.storableHeader(rec.header), body: rec.body}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// bodyDeadline sets a read deadline of d on every request that has a body,
// and lifts it once the body has been read.
func bodyDeadline(next http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			if err := rc.SetReadDeadline(time.Now().Add(d)); err == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts its read deadline at the body's end or close.
type deadlineBody struct {
	io.ReadCloser
	once sync.Once
	lift func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.lift)
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	b.once.Do(b.lift)
	return b.ReadCloser.Close()
}

// recorder is a ResponseWriter that keeps what is written: an answer
// recorded instead of sent.
type recorder struct {
	header http.Header
	status int
	body   []byte
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	r.body = append(r.body, p...)
	return len(p), nil
}
