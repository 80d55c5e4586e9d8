package idemhttp

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/sfv"
)

// DefaultHeaderName is the request header carrying the key (IETF draft
// "The Idempotency-Key HTTP Header Field").
const DefaultHeaderName = "Idempotency-Key"

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// RecordedHeader is set to "false" on a response whose handler ran but
// whose record could not be written (the store failed, or the lease was
// lost): the effect happened, but a retry after the lease expires will run
// it again. It is never set otherwise.
const RecordedHeader = "Idempotent-Recorded"

// defaultReplayHeaders are the response headers stored and replayed
// without being named in Config.ReplayHeaders.
var defaultReplayHeaders = []string{"Content-Type", "Location", "Content-Location", "ETag", "Last-Modified", "Link",
	"Request-Id", "X-Request-Id"}

// DefaultMaxBodyBytes is the default limit on a request body.
const DefaultMaxBodyBytes = 1 << 20

// DefaultMaxResponseBytes is the default limit on a captured response body.
// With the bounded headers and the format's framing, the encoded response
// stays within idem.DefaultMaxResultBytes, so a store with the default
// limit never turns it into a tombstone itself.
const DefaultMaxResponseBytes = idem.DefaultMaxResultBytes - MaxStoredHeaderBytes - 4*MaxStoredHeaders - 64

// ErrNotCovered is returned by [Middleware.Check] for a request the
// middleware lets through untouched: its method is not covered, or it
// carries no key and keys are optional.
var ErrNotCovered = errors.New("idemhttp: request is not subject to idempotency")

// errReleased is how the guarded function tells Guard.Do to release the key
// after a response the storage policy does not keep.
var errReleased = errors.New("idemhttp: response not stored, key released")

// Config configures a [Middleware]. A nil *Config means all defaults, which
// refuse every key-carrying request until a Principal (or SharedScope) is
// configured.
type Config struct {
	// HeaderName is the request header that carries the key. Default
	// "Idempotency-Key".
	HeaderName string
	// Methods are the methods the middleware applies to; other methods pass
	// through. Default POST and PATCH. Methods match whatever their case:
	// "post" is POST (servers such as Werkzeug treat it so), and it is
	// scoped and fingerprinted as POST.
	Methods []string
	// RequireKey makes a missing key a 400 instead of a pass-through.
	RequireKey bool

	// Principal returns the authenticated principal the key belongs to
	// (a user or account ID from your authentication middleware, never a
	// value the client can choose freely). Keys are scoped by principal,
	// method and route, so one principal never receives another's stored
	// response. An error or an empty principal gets a 400.
	Principal func(r *http.Request) (string, error)
	// SharedScope, set explicitly, lets requests without a principal share
	// one namespace per method and route. Only for services where every
	// client is trusted with every other client's responses.
	SharedScope bool
	// Route returns the route the request belongs to. Default r.Pattern
	// (set by http.ServeMux in Go 1.22+) or else the URL path. The request
	// URI is always part of the fingerprint, so the same key on two paths
	// of one pattern is a mismatch, not a replay.
	Route func(r *http.Request) string
	// SignificantHeaders are request headers that are part of the
	// fingerprint (for example Accept or a tenant header).
	SignificantHeaders []string
	// ReplayHeaders are response headers stored and replayed in addition to
	// Content-Type, Location, Content-Location, ETag, Last-Modified, Link,
	// Request-Id and X-Request-Id. Naming a header that is never stored
	// (Set-Cookie, Date, Authorization, rate-limit headers, hop-by-hop
	// headers…) is a configuration error. The Idempotency-Key header is
	// echoed on every response to a request that carries a valid one.
	ReplayHeaders []string

	// MaxBodyBytes bounds the request body. Default 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes bounds the stored response body. A larger response
	// still reaches the first caller in full, but the key becomes a
	// tombstone: retries get 410 (TypeResultDiscarded) and the handler does
	// not run again. Default DefaultMaxResponseBytes.
	MaxResponseBytes int

	// Lease, Retention and Wait configure the underlying idem.Guard: the
	// lease (heartbeated every Lease/3, default 30s, at least
	// idem.MinLease), how long responses are replayed (default 24h) and,
	// when positive, how long a retry waits for an in-flight first request
	// before answering 409.
	Lease     time.Duration
	Retention time.Duration
	Wait      time.Duration
	// RetryAfter is sent with 409 in-flight responses. Default 1s.
	RetryAfter time.Duration

	// Cache, if set, keeps completed responses in memory so that a replay
	// needs no store round trip; deletes and expiries reach it within
	// Cache.MaxAge (see [ReplayCache]). Default: no cache.
	Cache *ReplayCache

	// CancelOnDisconnect makes the handler's context end when the client
	// goes away, as plain net/http does. By default it does not: once the
	// handler has started, a client that disconnects or times out neither
	// cancels it nor releases the key; the response is recorded and the
	// client's retry gets 409 while it runs and the replay after. A client
	// that leaves before the handler starts (while its claim or Wait is
	// pending) still stops everything. With CancelOnDisconnect a lost lease
	// cancels the handler too.
	CancelOnDisconnect bool
	// HandlerTimeout, when positive, bounds the handler's context (which
	// the client's disconnect does not end). Default: no bound.
	HandlerTimeout time.Duration

	// ShouldStore decides from the final status whether a response is
	// stored and replayed (true) or the key released so a retry runs the
	// handler again (false). Default [DefaultShouldStore].
	ShouldStore func(status int) bool
	// RecoverPanics turns a handler panic into a 500 problem (after the key
	// is released) instead of letting it propagate. http.ErrAbortHandler
	// always propagates.
	RecoverPanics bool
	// AllowNonDurable accepts a store that loses its records on restart
	// (idemtest.MemoryStore). For tests only.
	AllowNonDurable bool

	// ErrorFormat selects the error responses' shape: [FormatProblem]
	// (RFC 9457, the default) or [FormatStripe].
	ErrorFormat ErrorFormat
	// ErrorHandler, if set, writes every error response instead (then
	// ErrorFormat is ignored).
	ErrorHandler func(w http.ResponseWriter, r *http.Request, p *Problem)
	// Hooks observe the requests the middleware handles (never a
	// pass-through), for logging, metrics and tracing: those implementing
	// [RequestStartHook] are called as the handling of a request starts,
	// and the context they return is the request's from then on (the
	// handler, or the proxy's upstream call, runs with it); those
	// implementing [RequestEndHook] are called once at its end, also when
	// the handler panics. The same hooks are the underlying idem.Guard's:
	// one implementing idem.DoStartHook or idem.DoEndHook sees every
	// execution attempt, with its heartbeat counts, and the handler's
	// context carries what its start hook added. contrib/idemprom
	// implements the end hooks, contrib/idemotel all of them.
	Hooks []idem.Hook
	// Logger receives failures that cannot be reported to the client
	// because the response was already sent. Default slog.Default().
	Logger *slog.Logger
}

// DefaultShouldStore stores 1xx–4xx final responses except 408, 409, 425
// and 429, which say "try again" and so must not be replayed; 5xx releases.
func DefaultShouldStore(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// Event describes one request the middleware handled, to its hooks.
type Event struct {
	// Request is the request being handled. Hooks must not read its body.
	// In a [RequestEndHook] its context is the one the start hooks
	// returned; a [RequestStartHook] builds on its ctx argument instead,
	// which holds what the hooks before it added.
	Request *http.Request
	// ScopeHash is [idem.ScopeHash] of the request's scope, safe to log; empty
	// when the request was rejected before its scope was known.
	ScopeHash string
	// Key is the idempotency key; empty when the request was rejected
	// before its key was known.
	Key string
	// Outcome is Processed, Released, Duplicate, InProgress, Mismatch,
	// Discarded, Rejected, Errored, Panicked, Tombstoned, Canceled,
	// NotRecorded or InDoubt (see the idem constants); it is empty in the
	// start hook.
	Outcome idem.Outcome
	// Status is the response's status code (499 when the client went away
	// before anything ran); zero in the start hook.
	Status int
	// Duration is how long the middleware took over the request, from its
	// arrival to the end of the response.
	Duration time.Duration
	// ClientGone is set when the client went away while its request was
	// handled; the handler went on and its response was recorded.
	ClientGone bool
	// Err is the failure behind idem.Errored, idem.NotRecorded or
	// idem.InDoubt, if any.
	Err error
}

// Middleware is an Idempotency-Key middleware over an [idem.Store]. Create
// it with [New]; it is safe for concurrent use.
type Middleware struct {
	guard     *idem.Guard
	cfg       Config
	starts    []RequestStartHook
	ends      []RequestEndHook
	doStarts  bool // a hook is an idem.DoStartHook
	header    string
	methods   map[string]bool
	allowed   map[string]bool
	errorFunc func(http.ResponseWriter, *http.Request, *Problem)
	cache     *replayCache // nil: no cache
	retention time.Duration
}

// New returns a middleware over store. It refuses a store that is not
// durable (idem.ErrNotDurable) unless cfg.AllowNonDurable is set.
func New(store idem.Store, cfg *Config) (*Middleware, error) {
	if store == nil {
		return nil, fmt.Errorf("idemhttp: %w: nil store", idem.ErrInvalidConfig)
	}
	m := &Middleware{}
	if cfg != nil {
		m.cfg = *cfg
	}
	c := &m.cfg
	if !idem.IsDurable(store) && !c.AllowNonDurable {
		return nil, fmt.Errorf("idemhttp: %w: replayed responses would be lost on restart (set AllowNonDurable only in tests)", idem.ErrNotDurable)
	}
	m.header = http.CanonicalHeaderKey(cmp(c.HeaderName, DefaultHeaderName))
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	m.methods = make(map[string]bool, len(c.Methods))
	for _, meth := range c.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	m.allowed = map[string]bool{}
	for _, h := range append(slices.Clone(defaultReplayHeaders), c.ReplayHeaders...) {
		if neverStored(h) {
			return nil, fmt.Errorf("idemhttp: %w: header %q is never stored or replayed", idem.ErrInvalidConfig, h)
		}
		m.allowed[http.CanonicalHeaderKey(h)] = true
	}
	c.SignificantHeaders = slices.Clone(c.SignificantHeaders) // never modify the caller's slice
	for i, h := range c.SignificantHeaders {
		c.SignificantHeaders[i] = http.CanonicalHeaderKey(h)
	}
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.RetryAfter <= 0 {
		c.RetryAfter = time.Second
	}
	if c.Lease != 0 && c.Lease < idem.MinLease {
		return nil, fmt.Errorf("idemhttp: %w: Lease %v is shorter than idem.MinLease (%v): it must leave room for a few heartbeats",
			idem.ErrInvalidConfig, c.Lease, idem.MinLease)
	}
	if c.HandlerTimeout < 0 {
		return nil, fmt.Errorf("idemhttp: %w: HandlerTimeout must not be negative, got %v", idem.ErrInvalidConfig, c.HandlerTimeout)
	}
	if c.ShouldStore == nil {
		c.ShouldStore = DefaultShouldStore
	}
	if c.Route == nil {
		c.Route = defaultRoute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	writeError, err := c.ErrorFormat.writer()
	if err != nil {
		return nil, err
	}
	m.errorFunc = c.ErrorHandler
	if m.errorFunc == nil {
		m.errorFunc = writeError
	}
	if c.Cache != nil {
		cc, err := c.Cache.validate()
		if err != nil {
			return nil, err
		}
		c.Cache = &cc
		m.cache = newReplayCache(cc)
	}
	m.retention = c.Retention
	if m.retention <= 0 {
		m.retention = idem.DefaultRetention
	}
	c.Hooks = slices.Clone(c.Hooks)
	m.starts = idem.HooksOf[RequestStartHook](c.Hooks)
	m.ends = idem.HooksOf[RequestEndHook](c.Hooks)
	m.doStarts = len(idem.HooksOf[idem.DoStartHook](c.Hooks)) > 0
	m.guard = idem.NewGuard(store, &idem.GuardConfig{
		Lease: c.Lease, Retention: c.Retention, Wait: c.Wait, Logger: c.Logger, Hooks: c.Hooks,
	})
	return m, nil
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}

// neverStored reports whether a response header must never be stored or
// replayed: credentials, per-response metadata and hop-by-hop fields.
func neverStored(h string) bool {
	l := strings.ToLower(h)
	if strings.Contains(l, "ratelimit") || strings.Contains(l, "rate-limit") {
		return true
	}
	switch l {
	case "set-cookie", "set-cookie2", "cookie", "authorization", "www-authenticate", "proxy-authenticate",
		"proxy-authorization", "date", "retry-after", "age", "content-length", "transfer-encoding", "connection",
		"keep-alive", "te", "trailer", "upgrade", "proxy-connection", strings.ToLower(ReplayedHeader):
		return true
	}
	return false
}

// storableHeader copies the allow-listed headers of h, within the bounds.
func (m *Middleware) storableHeader(h http.Header) http.Header {
	out := http.Header{}
	count, size := 0, 0
	for k, vs := range h {
		if !m.allowed[k] {
			continue
		}
		for _, v := range vs {
			if len(v) > maxStoredField || count == MaxStoredHeaders || size+len(k)+len(v) > MaxStoredHeaderBytes {
				continue
			}
			out[k] = append(out[k], v)
			count++
			size += len(k) + len(v)
		}
	}
	return out
}

// Guard returns the idem.Guard the middleware runs handlers under, for
// callers of [Middleware.Check] that build their own responses.
func (m *Middleware) Guard() *idem.Guard { return m.guard }

// Check prepares r for an idempotent execution without touching the store:
// it parses and validates the key, determines the scope, reads the body
// (within MaxBodyBytes, decoding a gzip or deflate Content-Encoding; r.Body
// is replaced so it can be read again) and computes the fingerprint. It
// returns ErrNotCovered for a request the middleware would let through, or
// a *Problem describing why r must be rejected. Callers that build their
// own responses pass the Call to Guard().Do.
func (m *Middleware) Check(r *http.Request) (idem.Call, error) {
	c, p := m.check(nil, r)
	if p != nil {
		return c.call, p
	}
	return c.call, nil
}

// checked is what the middleware knows of a covered request once its
// key and scope are determined.
type checked struct {
	call          idem.Call
	raw           string // the key header's value as sent
	method, route string
	// rawFP is the raw digest of the request (see rawFingerprint), taken
	// only when there is a replay cache; zero otherwise.
	rawFP idem.Fingerprint
}

// check is Check with the response writer, so that an oversized body also
// closes the connection.
func (m *Middleware) check(w http.ResponseWriter, r *http.Request) (checked, *Problem) {
	c, p := m.checkHead(r)
	if p == nil {
		p = m.checkBody(w, r, &c)
	}
	return c, p
}

// checkHead determines from the request's head whether it is covered, and
// its key and scope. c.raw is set once the key is known to be valid.
func (m *Middleware) checkHead(r *http.Request) (c checked, p *Problem) {
	c.method = strings.ToUpper(r.Method)
	if !m.methods[c.method] {
		return c, notCovered
	}
	values := r.Header.Values(m.header)
	switch {
	case len(values) == 0 && !m.cfg.RequireKey:
		return c, notCovered
	case len(values) == 0:
		return c, newProblem(http.StatusBadRequest, TypeKeyMissing, "Idempotency-Key required",
			fmt.Errorf("this endpoint requires an %s header", m.header))
	case len(values) > 1:
		return c, newProblem(http.StatusBadRequest, TypeKeyInvalid, "Invalid Idempotency-Key",
			fmt.Errorf("%w: %d %s headers; send exactly one", idem.ErrInvalidKey, len(values), m.header))
	}
	key, err := parseKey(values[0])
	if err != nil {
		return c, newProblem(http.StatusBadRequest, TypeKeyInvalid, "Invalid Idempotency-Key", err)
	}
	c.call.Key, c.raw = key, values[0]

	c.route = m.cfg.Route(r)
	principal := ""
	switch {
	case m.cfg.Principal != nil:
		principal, err = m.cfg.Principal(r)
		if err == nil && principal == "" && !m.cfg.SharedScope {
			err = errors.New("no authenticated principal for this request")
		}
	case !m.cfg.SharedScope:
		err = errors.New("the server has no Principal function configured and shared scope is off")
	}
	if err != nil {
		return c, newProblem(http.StatusBadRequest, TypeScopeMissing, "Idempotency key cannot be scoped",
			fmt.Errorf("%w: %w", idem.ErrInvalidScope, err))
	}
	c.call.Scope = scopeOf(principal, c.method, c.route)
	return c, nil
}

// checkBody reads the body of a request checkHead accepted and sets the
// call's fingerprint.
func (m *Middleware) checkBody(w http.ResponseWriter, r *http.Request, c *checked) *Problem {
	body, p := m.readBody(w, r)
	if p != nil {
		return p
	}
	return m.fingerprint(r, c, body)
}

// rawFingerprint digests what the fingerprint is computed from as it
// arrived: method, route, request URI, the Content-Encoding and
// Content-Type that content reads, the body undecoded and the significant
// headers. Two requests with the same digest have the same fingerprint
// and the same fate in content, so a replay cache entry recorded for one
// answers the other without decoding or canonicalising its body.
func (m *Middleware) rawFingerprint(r *http.Request, c *checked, body []byte) idem.Fingerprint {
	fw := newFPWriter()
	fw.str("idemhttp-raw-v1")
	fw.str(c.method)
	fw.str(c.route)
	fw.str(r.URL.RequestURI())
	fw.str(r.Header.Get("Content-Encoding"))
	fw.str(r.Header.Get("Content-Type"))
	fw.bytes(body)
	m.significant(fw, r)
	return fw.sum()
}

func (m *Middleware) significant(fw *fpWriter, r *http.Request) {
	for _, h := range m.cfg.SignificantHeaders {
		fw.str(h)
		fw.header(r.Header.Values(h))
	}
}

// fingerprint sets the call's fingerprint from the request and its body.
func (m *Middleware) fingerprint(r *http.Request, c *checked, body []byte) *Problem {
	kind, content, p := m.content(r, body)
	if p != nil {
		return p
	}
	// idem.FingerprintParts("idemhttp-v1", method, route, request URI,
	// kind, content, then each significant header's name and its values
	// joined by "\n"), without building the parts.
	fw := newFPWriter()
	fw.str("idemhttp-v1")
	fw.str(c.method)
	fw.str(c.route)
	fw.str(r.URL.RequestURI())
	fw.str(kind)
	fw.bytes(content)
	m.significant(fw, r)
	c.call.Fingerprint = fw.sum()
	return nil
}

// content returns what the fingerprint hashes of body: its kind and its
// bytes, decoded from a gzip or deflate Content-Encoding and, for JSON,
// canonicalised. A JSON document and the same bytes sent as another media
// type never match; a body in an encoding idem does not decode is hashed
// as it is, with the encoding's name.
func (m *Middleware) content(r *http.Request, body []byte) (kind string, content []byte, p *Problem) {
	content = body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip", "deflate":
		var err error
		if content, err = m.decode(enc, body); err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return "", nil, newProblem(http.StatusRequestEntityTooLarge, TypeBodyTooLarge, "Request body too large",
					fmt.Errorf("decoded from %s, the body exceeds the limit of %d bytes", enc, mbe.Limit))
			}
			return "", nil, newProblem(http.StatusBadRequest, TypeBodyInvalid, "Request body could not be decoded",
				fmt.Errorf("Content-Encoding %s: %w", enc, err))
		}
	default:
		return "raw;" + enc, body, nil
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		return "raw", content, nil
	}
	// A JSON request without a document (empty or only white space) has
	// nothing to canonicalise; it fingerprints as empty.
	if len(bytes.TrimSpace(content)) == 0 {
		return "json", nil, nil
	}
	canon, err := idem.CanonicalJSON(content)
	if err != nil {
		return "", nil, newProblem(http.StatusBadRequest, TypeBodyInvalid, "Invalid JSON body", err)
	}
	return "json", canon, nil
}

// decode undoes a gzip or deflate (zlib) Content-Encoding, within
// MaxBodyBytes of decoded output.
func (m *Middleware) decode(enc string, body []byte) ([]byte, error) {
	var (
		zr  io.ReadCloser
		err error
	)
	if enc == "deflate" {
		zr, err = zlib.NewReader(bytes.NewReader(body))
	} else {
		zr, err = gzip.NewReader(bytes.NewReader(body))
	}
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	out, err := readAll(nil, io.LimitReader(zr, m.cfg.MaxBodyBytes+1), int64(len(body))*2)
	if err != nil {
		return nil, err
	}
	if int64(len(out)) > m.cfg.MaxBodyBytes {
		return nil, &http.MaxBytesError{Limit: m.cfg.MaxBodyBytes}
	}
	return out, nil
}

// notCovered is a sentinel problem that check returns for a pass-through.
var notCovered = &Problem{Err: ErrNotCovered}

func parseKey(v string) (string, error) {
	if key, ok := plainQuoted(v); ok {
		return key, idem.ValidateKey(key)
	}
	return parseKeySlow(v)
}

// parseKeySlow is parseKey for every form of the header.
func parseKeySlow(v string) (string, error) {
	var (
		key string
		err error
	)
	if strings.HasPrefix(strings.TrimLeft(v, " "), `"`) {
		key, err = sfv.ParseStringItem(v)
	} else {
		key, err = sfv.ParseBareKey(v)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", idem.ErrInvalidKey, err)
	}
	return key, idem.ValidateKey(key)
}

// scopeOf builds the scope from its parts. The quoted principal makes the
// form unambiguous; a scope too long for a store is replaced by its hash.
func scopeOf(principal, method, route string) string {
	s := "http " + quoted(principal) + " " + method + " " + route
	if idem.ValidateScope(s) == nil {
		return s
	}
	return "http sha256:" + idem.FingerprintParts([]byte(principal), []byte(method), []byte(route)).String()
}

func isJSON(contentType string) bool {
	if contentType == "application/json" {
		return true // the common case, without parsing
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// readBody reads the whole body within MaxBodyBytes into one buffer and
// replaces r.Body so that it can be read again. A declared Content-Length
// over the limit is refused before anything is read or allocated.
func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *Problem) {
	body, p := m.readBodyInto(w, r, nil)
	if p == nil && body != nil {
		setBody(r, body)
	}
	return body, p
}

// readBodyInto is readBody into buf when it is large enough, without
// replacing r.Body. The body is nil when the request has none.
func (m *Middleware) readBodyInto(w http.ResponseWriter, r *http.Request, buf []byte) ([]byte, *Problem) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	tooLarge := func() *Problem {
		return newProblem(http.StatusRequestEntityTooLarge, TypeBodyTooLarge, "Request body too large",
			fmt.Errorf("the limit is %d bytes", m.cfg.MaxBodyBytes))
	}
	if r.ContentLength > m.cfg.MaxBodyBytes {
		if w != nil {
			// The body stays unread: the connection cannot be reused.
			w.Header().Set("Connection", "close")
		}
		return nil, tooLarge()
	}
	body, err := readAll(buf, http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes), r.ContentLength)
	_ = r.Body.Close()
	if err != nil {
		var (
			mbe *http.MaxBytesError
			ne  net.Error
		)
		switch {
		case errors.As(err, &mbe):
			return nil, tooLarge()
		case errors.As(err, &ne) && ne.Timeout():
			return nil, newProblem(http.StatusRequestTimeout, TypeBodyTimeout, "Request body timed out",
				errors.New("the body did not arrive within the server's read deadline"))
		}
		return nil, newProblem(http.StatusBadRequest, TypeBodyInvalid, "Request body could not be read", err)
	}
	return body, nil
}

// setBody makes body, read from r, r's body again.
func setBody(r *http.Request, body []byte) {
	br := &bodyReader{}
	br.Reset(body)
	r.Body = br
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// bodyPool holds the buffers the bodies of cached replays are read into:
// such a body is only hashed, so its buffer can serve the next request.
var bodyPool = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody bounds the buffers bodyPool keeps.
const maxPooledBody = 64 << 10

// readAndReplay reads the body and, with a replay cache, answers a retry
// byte for byte like the request that filled a cache entry: such a retry
// needs neither its body decoded nor its fingerprint. done reports that
// the replay is written; otherwise the body is read (r.Body replaced), or
// p says why it could not be.
func (m *Middleware) readAndReplay(w http.ResponseWriter, r *http.Request, c *checked, ev *Event) (body []byte, done bool, p *Problem) {
	if m.cache == nil {
		body, p = m.readBody(w, r)
		return body, false, p
	}
	buf := bodyPool.Get().(*[]byte)
	if body, p = m.readBodyInto(w, r, *buf); p != nil {
		return nil, false, p
	}
	c.rawFP = m.rawFingerprint(r, c, body)
	if sr, ok := m.cache.getRaw(c.call.Scope, c.call.Key, c.rawFP); ok {
		m.writeReplay(w, sr, c.raw, ev)
		if body != nil && cap(body) <= maxPooledBody {
			*buf = body[:0]
		}
		bodyPool.Put(buf)
		return nil, true, nil
	}
	if body == nil {
		bodyPool.Put(buf)
		return nil, false, nil
	}
	setBody(r, body) // the buffer is the request's from now on
	return body, false, nil
}

// bodyReader is the request body once read: io.NopCloser(bytes.NewReader)
// in one allocation.
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// readAll is io.ReadAll with a first buffer of size hint (when positive),
// so a body of known length is read into one allocation: buf when it is
// large enough.
func readAll(buf []byte, r io.Reader, hint int64) ([]byte, error) {
	b := buf[:0]
	if size := max(512, min(hint, 1<<20)+1); int64(cap(b)) < size {
		b = make([]byte, 0, size)
	}
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// Handler wraps next. Its method value has the usual middleware type
// func(http.Handler) http.Handler.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		c, p := m.checkHead(r)
		if p == notCovered {
			next.ServeHTTP(w, r)
			return
		}
		ev := Event{Request: r, Key: c.call.Key}
		if len(m.starts) > 0 || len(m.ends) > 0 {
			if c.call.Scope != "" {
				ev.ScopeHash = idem.ScopeHash(c.call.Scope)
			}
			ctx := r.Context()
			for _, h := range m.starts {
				ctx = h.OnRequestStart(ctx, ev)
			}
			if ctx != r.Context() {
				r = r.WithContext(ctx)
				ev.Request = r
			}
			// Deferred so that a propagating panic is reported too.
			defer func() {
				ev.Duration = time.Since(start)
				for _, h := range m.ends {
					h.OnRequestEnd(ctx, ev)
				}
			}()
		}
		var body []byte
		if p == nil {
			var done bool
			if body, done, p = m.readAndReplay(w, r, &c, &ev); done {
				return
			}
		}
		if c.raw != "" {
			w.Header().Set(m.header, c.raw)
		}
		if p == nil {
			p = m.fingerprint(r, &c, body)
		}
		if p != nil {
			ev.Outcome, ev.Status = idem.Rejected, p.Status
			m.errorFunc(w, r, p)
			return
		}
		m.serve(w, r, next, &c, &ev)
	})
}

// errClientLeft ends an execution whose client went away before its
// handler started.
var errClientLeft = errors.New("idemhttp: the client went away before the handler started")

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, c *checked, ev *Event) {
	call, raw := c.call, c.raw
	if sr, ok := m.cache.get(call.Scope, call.Key, call.Fingerprint); ok {
		m.writeReplay(w, sr, "", ev)
		return
	}
	// Any record this call completes expires no earlier than this.
	cacheUntil := time.Now().Add(m.retention)
	cw := &captureWriter{rw: w, m: m, limit: m.cfg.MaxResponseBytes, echo: raw}
	// The execution's context. Until the handler starts, the client's
	// disconnect ends it (the claim, a Wait); from then on it does not,
	// unless CancelOnDisconnect is set.
	execCtx, cancelExec := context.WithCancelCause(context.WithoutCancel(r.Context()))
	defer cancelExec(nil)
	var (
		mu      sync.Mutex
		started bool
	)
	stopWatch := context.AfterFunc(r.Context(), func() {
		mu.Lock()
		defer mu.Unlock()
		if !started || m.cfg.CancelOnDisconnect {
			cancelExec(context.Cause(r.Context()))
		}
	})
	defer stopWatch()

	var (
		ran      bool
		recorded *storedResponse
	)
	fn := func(ctx context.Context, run idem.Run) ([]byte, error) {
		mu.Lock()
		if execCtx.Err() != nil {
			mu.Unlock()
			return nil, errClientLeft // the key is released: nothing ran
		}
		started = true
		mu.Unlock()
		// The handler runs on the execution's context, not on the lease's:
		// a lost lease does not abort an execution that may already have
		// had its effect; only its record is refused.
		hctx := execCtx
		switch {
		case m.cfg.CancelOnDisconnect:
			hctx = ctx
		case m.doStarts:
			// What the Guard's start hooks added to ctx (a span) is the
			// handler's too, so that the handler's spans are its children;
			// the lease's cancellation is not.
			var cancel context.CancelCauseFunc
			hctx, cancel = context.WithCancelCause(context.WithoutCancel(ctx))
			defer cancel(nil)
			defer context.AfterFunc(execCtx, func() { cancel(context.Cause(execCtx)) })()
		}
		if m.cfg.HandlerTimeout > 0 {
			var cancel context.CancelFunc
			hctx, cancel = context.WithTimeout(hctx, m.cfg.HandlerTimeout)
			defer cancel()
		}
		ran = true
		// idem.StepsFrom(r.Context()) gives the handler its recovery points.
		next.ServeHTTP(cw, r.WithContext(idem.ContextWithRun(hctx, run)))
		rec := cw.record()
		if rec == nil {
			return nil, errReleased
		}
		recorded = rec
		return rec.encode(), nil
	}
	res, err := m.do(execCtx, r, call, fn, cw, ev)
	if ev.Outcome == idem.Panicked {
		return
	}
	defer func() {
		// A write that failed says the client left; so does its context,
		// which net/http ends when it sees the connection go. Held-back
		// writes land in net/http's buffer and rarely fail at all.
		ev.ClientGone = cw.gone || r.Context().Err() != nil
		if cw.abort {
			// The response broke off after part of it was sent: end the
			// client's connection rather than pretend it is whole. What the
			// retry gets is what was recorded.
			panic(http.ErrAbortHandler)
		}
	}()
	if cw.hijacked {
		// The connection belongs to the handler; nothing more may be
		// written to it.
		ev.Outcome, ev.Status = idem.Tombstoned, http.StatusSwitchingProtocols
		if err != nil {
			ev.Outcome, ev.Err = idem.NotRecorded, err
		}
		return
	}
	switch {
	case ran && err != nil && !errors.Is(err, errReleased) && !errors.Is(err, errClientLeft):
		// The handler ran and its response is on its way; only the record
		// failed (lost lease, store down). The response says so, and the
		// key stays claimed until its lease expires, so an immediate retry
		// gets 409 rather than a second run.
		if cw.streaming {
			// The header went out with the stream: say it in a trailer,
			// which a chunked response carries at its end.
			w.Header().Set(http.TrailerPrefix+RecordedHeader, "false")
		} else {
			w.Header().Set(RecordedHeader, "false")
		}
		cw.commit()
		ev.Outcome, ev.Status, ev.Err = idem.NotRecorded, cw.finalStatus(), err
		m.cfg.Logger.Error("idemhttp: handler ran but its response could not be recorded; a retry after the lease expires runs it again",
			"scope_hash", idem.ScopeHash(call.Scope), "key", call.Key, "status", cw.finalStatus(), "err", err)
		return
	case err == nil && !res.Replayed:
		cw.commit()
		ev.Outcome, ev.Status = idem.Processed, cw.finalStatus()
		switch {
		case cw.inDoubt:
			ev.Outcome = idem.InDoubt
		case cw.over:
			ev.Outcome = idem.Tombstoned
		default:
			m.cache.put(call.Scope, call.Key, call.Fingerprint, c.rawFP, recorded, cacheUntil)
		}
		return
	case errors.Is(err, errReleased):
		cw.commit()
		ev.Outcome, ev.Status = idem.Released, cw.finalStatus()
		if cw.inDoubt {
			ev.Outcome = idem.InDoubt
		}
		return
	}
	switch {
	case err == nil:
		m.replay(w, r, c, res, ev)
	case errors.Is(err, idem.ErrInProgress):
		p := newProblem(http.StatusConflict, TypeKeyInFlight, "Request with this Idempotency-Key is in flight",
			errors.New("a request with this key is still being processed; retry later"))
		p.Err, p.RetryAfter = idem.ErrInProgress, m.cfg.RetryAfter
		m.reject(w, r, p, idem.InProgress, ev)
	case errors.Is(err, idem.ErrFingerprintMismatch):
		p := newProblem(http.StatusUnprocessableEntity, TypeKeyReused, "Idempotency-Key reused with a different request",
			errors.New("this key was already used with a different method, path, body or significant header"))
		p.Err = idem.ErrFingerprintMismatch
		m.reject(w, r, p, idem.Mismatch, ev)
	case errors.Is(err, idem.ErrResultDiscarded):
		m.cache.forget(call.Scope, call.Key)
		m.discarded(w, r, ev, false)
	case r.Context().Err() != nil:
		// The client left (typically while waiting for an in-flight first
		// request); nothing ran and nobody is listening. 499 as in nginx.
		ev.Outcome, ev.Status, ev.Err = idem.Canceled, 499, err
	default:
		p := newProblem(http.StatusServiceUnavailable, TypeStoreUnavailable, "Idempotency store unavailable", err)
		p.Detail, p.RetryAfter = "the request was not processed; retry later", m.cfg.RetryAfter
		ev.Err = err
		m.reject(w, r, p, idem.Errored, ev)
	}
}

// do runs Guard.Do, turning a handler panic into a 500 when configured.
func (m *Middleware) do(ctx context.Context, r *http.Request, call idem.Call, fn func(context.Context, idem.Run) ([]byte, error),
	cw *captureWriter, ev *Event) (res idem.Result, err error) {
	panicking := true
	defer func() {
		if !panicking {
			return
		}
		ev.Outcome, ev.Status = idem.Panicked, http.StatusInternalServerError
		if !m.cfg.RecoverPanics {
			return // the panic continues on its own
		}
		v := recover()
		if v == http.ErrAbortHandler {
			panic(v)
		}
		m.cfg.Logger.Error("idemhttp: handler panicked; key released", "scope_hash", idem.ScopeHash(call.Scope), "key", call.Key, "panic", v)
		if !cw.streaming && !cw.hijacked {
			m.errorFunc(cw.rw, r, newProblem(http.StatusInternalServerError, TypeHandlerPanic, "Internal error",
				errors.New("the request failed and was not recorded; it may be retried")))
		}
	}()
	res, err = m.guard.Do(ctx, call, fn)
	panicking = false
	return res, err
}

func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, p *Problem, o idem.Outcome, ev *Event) {
	ev.Outcome, ev.Status = o, p.Status
	m.errorFunc(w, r, p)
}

func (m *Middleware) discarded(w http.ResponseWriter, r *http.Request, ev *Event, upgraded bool) {
	p := newProblem(http.StatusGone, TypeResultDiscarded, "Response not available", idem.ErrResultDiscarded)
	if upgraded {
		p = newProblem(http.StatusGone, TypeResponseNotRecordable, "Response not available",
			errors.New("the request with this key switched protocols (101); it will not run again and there is nothing to replay"))
		p.Err = idem.ErrResultDiscarded
	}
	m.reject(w, r, p, idem.Discarded, ev)
}

func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, c *checked, res idem.Result, ev *Event) {
	call := c.call
	sr, err := decodeResponse(res.Value)
	if err != nil {
		m.reject(w, r, newProblem(http.StatusInternalServerError, TypeStoredResponseInvalid, "Stored response invalid", err),
			idem.Errored, ev)
		return
	}
	if sr.discarded {
		m.discarded(w, r, ev, sr.upgraded)
		return
	}
	m.cache.put(call.Scope, call.Key, call.Fingerprint, c.rawFP, sr, res.ExpiresAt)
	m.writeReplay(w, sr, "", ev)
}

// writeReplay writes a stored response as the replay of a request, and
// echo, when not empty, as its Idempotency-Key header.
func (m *Middleware) writeReplay(w http.ResponseWriter, sr *storedResponse, echo string, ev *Event) {
	lines := sr.lines
	if lines == nil {
		lines = newReplayLines(sr)
	}
	lines.set(w.Header(), m.header, echo)
	w.WriteHeader(sr.status)
	_, _ = w.Write(sr.body)
	ev.Outcome, ev.Status = idem.Duplicate, sr.status
}
