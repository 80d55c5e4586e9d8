package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/sfv"
)

// DefaultHeaderName is the request header carrying the key (IETF draft
// "The Idempotency-Key HTTP Header Field").
const DefaultHeaderName = "Idempotency-Key"

// ReplayedHeader is set to "true" on every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

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
	// through. Default POST and PATCH.
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
	// StoreHeaders are response headers stored and replayed in addition to
	// Content-Type, Location, Content-Location, ETag, Last-Modified and
	// Link. Naming a header that is never stored (Set-Cookie, Date,
	// Authorization, rate-limit headers, hop-by-hop headers…) is a
	// configuration error.
	StoreHeaders []string

	// MaxBodyBytes bounds the request body. Default 1 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes bounds the stored response body. A larger response
	// still reaches the first caller in full, but the key becomes a
	// tombstone: retries get 410 (TypeResultDiscarded) and the handler does
	// not run again. Default DefaultMaxResponseBytes.
	MaxResponseBytes int

	// Lease, Retention and Wait configure the underlying idem.Guard: the
	// lease (heartbeated every Lease/3, default 30s), how long responses
	// are replayed (default 24h) and, when positive, how long a retry
	// waits for an in-flight first request before answering 409.
	Lease     time.Duration
	Retention time.Duration
	Wait      time.Duration
	// RetryAfter is sent with 409 in-flight responses. Default 1s.
	RetryAfter time.Duration

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

	// ErrorHandler writes every error response. Default [WriteProblem].
	ErrorHandler func(w http.ResponseWriter, r *http.Request, p *Problem)
	// OnRequest, if set, is called once per request the middleware handles
	// (not for pass-throughs), for logging and metrics.
	OnRequest func(r *http.Request, e Event)
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

// Outcome says what the middleware did with one request.
type Outcome string

// Outcomes reported in [Event].
const (
	OutcomeExecuted  Outcome = "executed"   // the handler ran; its response was stored
	OutcomeReleased  Outcome = "released"   // the handler ran; the key was released
	OutcomeReplayed  Outcome = "replayed"   // a stored response was replayed
	OutcomeInFlight  Outcome = "in_flight"  // 409: the first request is still running
	OutcomeMismatch  Outcome = "mismatch"   // 422: the key was used with another request
	OutcomeDiscarded Outcome = "discarded"  // 410: completed, response too large to keep
	OutcomeRejected  Outcome = "rejected"   // 4xx before the store was touched
	OutcomeError     Outcome = "error"      // a store failure or a lost lease
	OutcomePanic     Outcome = "panic"      // the handler panicked; the key was released
	OutcomeTombstone Outcome = "tombstoned" // the handler ran; its response was too large to keep
	OutcomeCanceled  Outcome = "canceled"   // the client went away before the handler ran
)

// Event describes one request the middleware handled.
type Event struct {
	// ScopeHash is a short SHA-256 of the scope, safe to log.
	ScopeHash string
	Key       string
	Outcome   Outcome
	Status    int
	Latency   time.Duration
	// Err is the failure behind OutcomeError, if any.
	Err error
}

// Middleware is an Idempotency-Key middleware over an [idem.Store]. Create
// it with [New]; it is safe for concurrent use.
type Middleware struct {
	guard     *idem.Guard
	cfg       Config
	header    string
	methods   map[string]bool
	allowed   map[string]bool
	errorFunc func(http.ResponseWriter, *http.Request, *Problem)
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
		m.methods[meth] = true
	}
	m.allowed = map[string]bool{}
	for _, h := range append([]string{"Content-Type", "Location", "Content-Location", "ETag", "Last-Modified", "Link"}, c.StoreHeaders...) {
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
	if c.ShouldStore == nil {
		c.ShouldStore = DefaultShouldStore
	}
	if c.Route == nil {
		c.Route = defaultRoute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	m.errorFunc = c.ErrorHandler
	if m.errorFunc == nil {
		m.errorFunc = WriteProblem
	}
	m.guard = idem.NewGuard(store, &idem.GuardConfig{
		Lease: c.Lease, Retention: c.Retention, Wait: c.Wait, Logger: c.Logger,
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
// (within MaxBodyBytes; r.Body is replaced so it can be read again) and
// computes the fingerprint. It returns ErrNotCovered for a request the
// middleware would let through, or a *Problem describing why r must be
// rejected. Callers that build their own responses pass the Call to
// Guard().Do.
func (m *Middleware) Check(r *http.Request) (idem.Call, error) {
	call, p := m.check(nil, r)
	if p != nil {
		return call, p
	}
	return call, nil
}

// check is Check with the response writer, so that an oversized body also
// closes the connection.
func (m *Middleware) check(w http.ResponseWriter, r *http.Request) (idem.Call, *Problem) {
	var call idem.Call
	if !m.methods[r.Method] {
		return call, notCovered
	}
	values := r.Header.Values(m.header)
	switch {
	case len(values) == 0 && !m.cfg.RequireKey:
		return call, notCovered
	case len(values) == 0:
		return call, newProblem(http.StatusBadRequest, TypeKeyMissing, "Idempotency-Key required",
			fmt.Errorf("this endpoint requires an %s header", m.header))
	case len(values) > 1:
		return call, newProblem(http.StatusBadRequest, TypeKeyInvalid, "Invalid Idempotency-Key",
			fmt.Errorf("%w: %d %s headers; send exactly one", idem.ErrInvalidKey, len(values), m.header))
	}
	key, err := parseKey(values[0])
	if err != nil {
		return call, newProblem(http.StatusBadRequest, TypeKeyInvalid, "Invalid Idempotency-Key", err)
	}
	call.Key = key

	route := m.cfg.Route(r)
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
		return call, newProblem(http.StatusBadRequest, TypeScopeMissing, "Idempotency key cannot be scoped",
			fmt.Errorf("%w: %w", idem.ErrInvalidScope, err))
	}
	call.Scope = scopeOf(principal, r.Method, route)

	body, p := m.readBody(w, r)
	if p != nil {
		return call, p
	}
	// The content's kind is hashed too, so that a JSON document and the
	// same bytes sent as another media type never match.
	kind, content := "raw", body
	if isJSON(r.Header.Get("Content-Type")) {
		kind = "json"
		// A JSON request without a document (empty or only white space)
		// has nothing to canonicalise; it fingerprints as empty.
		if len(bytes.TrimSpace(body)) == 0 {
			content = nil
		} else if content, err = idem.CanonicalJSON(body); err != nil {
			return call, newProblem(http.StatusBadRequest, TypeBodyInvalid, "Invalid JSON body", err)
		}
	}
	parts := make([][]byte, 0, 6+2*len(m.cfg.SignificantHeaders))
	parts = append(parts, []byte("idemhttp-v1"), []byte(r.Method), []byte(route), []byte(r.URL.RequestURI()),
		[]byte(kind), content)
	for _, h := range m.cfg.SignificantHeaders {
		parts = append(parts, []byte(h), []byte(strings.Join(r.Header.Values(h), "\n")))
	}
	call.Fingerprint = idem.FingerprintParts(parts...)
	return call, nil
}

// notCovered is a sentinel problem that check returns for a pass-through.
var notCovered = &Problem{Err: ErrNotCovered}

func parseKey(v string) (string, error) {
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
	s := "http " + strconv.Quote(principal) + " " + method + " " + route
	if idem.ValidateScope(s) == nil {
		return s
	}
	return "http sha256:" + idem.FingerprintParts([]byte(principal), []byte(method), []byte(route)).String()
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

func (m *Middleware) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *Problem) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes))
	_ = r.Body.Close()
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, newProblem(http.StatusRequestEntityTooLarge, TypeBodyTooLarge, "Request body too large",
				fmt.Errorf("the limit is %d bytes", mbe.Limit))
		}
		return nil, newProblem(http.StatusBadRequest, TypeBodyInvalid, "Request body could not be read", err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return body, nil
}

// Handler wraps next. Its method value has the usual middleware type
// func(http.Handler) http.Handler.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		call, p := m.check(w, r)
		if p == notCovered {
			next.ServeHTTP(w, r)
			return
		}
		ev := Event{Key: call.Key}
		if m.cfg.OnRequest != nil {
			if call.Scope != "" {
				ev.ScopeHash = scopeHash(call.Scope)
			}
			// Deferred so that a propagating panic is reported too.
			defer func() {
				ev.Latency = time.Since(start)
				m.cfg.OnRequest(r, ev)
			}()
		}
		if p != nil {
			ev.Outcome, ev.Status = OutcomeRejected, p.Status
			m.errorFunc(w, r, p)
			return
		}
		m.serve(w, r, next, call, &ev)
	})
}

func scopeHash(scope string) string {
	h := sha256.Sum256([]byte(scope))
	return hex.EncodeToString(h[:8])
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, call idem.Call, ev *Event) {
	cw := &captureWriter{rw: w, m: m, limit: m.cfg.MaxResponseBytes}
	ran := false
	fn := func(ctx context.Context, _ idem.Run) ([]byte, error) {
		ran = true
		next.ServeHTTP(cw, r.WithContext(ctx))
		status := cw.finalStatus()
		if cw.release || !m.cfg.ShouldStore(status) {
			return nil, errReleased
		}
		rec := storedResponse{status: status, header: cw.header, body: cw.body.Bytes(), discarded: cw.over}
		if cw.over {
			rec.header, rec.body = nil, nil
		}
		return rec.encode(), nil
	}
	res, err := m.do(r, call, fn, cw, ev)
	if ev.Outcome == OutcomePanic {
		return
	}
	cw.commit()
	switch {
	case err == nil && !res.Replayed:
		ev.Outcome, ev.Status = OutcomeExecuted, cw.finalStatus()
		if cw.over {
			ev.Outcome = OutcomeTombstone
		}
	case err == nil:
		m.replay(w, r, res.Value, ev)
	case errors.Is(err, errReleased):
		ev.Outcome, ev.Status = OutcomeReleased, cw.finalStatus()
	case errors.Is(err, idem.ErrInProgress):
		p := newProblem(http.StatusConflict, TypeKeyInFlight, "Request with this Idempotency-Key is in flight",
			errors.New("a request with this key is still being processed; retry later"))
		p.Err, p.RetryAfter = idem.ErrInProgress, m.cfg.RetryAfter
		m.reject(w, r, p, OutcomeInFlight, ev)
	case errors.Is(err, idem.ErrFingerprintMismatch):
		p := newProblem(http.StatusUnprocessableEntity, TypeKeyReused, "Idempotency-Key reused with a different request",
			errors.New("this key was already used with a different method, path, body or significant header"))
		p.Err = idem.ErrFingerprintMismatch
		m.reject(w, r, p, OutcomeMismatch, ev)
	case errors.Is(err, idem.ErrResultDiscarded):
		m.discarded(w, r, ev)
	case ran:
		// The handler ran and its response is on its way; only the record
		// failed (lost lease, store down). Nothing can be said to the client.
		ev.Outcome, ev.Status, ev.Err = OutcomeError, cw.finalStatus(), err
		m.cfg.Logger.Error("idemhttp: handler ran but its response could not be recorded",
			"scope_hash", scopeHash(call.Scope), "key", call.Key, "err", err)
	case r.Context().Err() != nil:
		// The client left (typically while waiting for an in-flight first
		// request); nothing ran and nobody is listening. 499 as in nginx.
		ev.Outcome, ev.Status, ev.Err = OutcomeCanceled, 499, err
	default:
		p := newProblem(http.StatusServiceUnavailable, TypeStoreUnavailable, "Idempotency store unavailable", err)
		p.Detail, p.RetryAfter = "the request was not processed; retry later", m.cfg.RetryAfter
		ev.Err = err
		m.reject(w, r, p, OutcomeError, ev)
	}
}

// do runs Guard.Do, turning a handler panic into a 500 when configured.
func (m *Middleware) do(r *http.Request, call idem.Call, fn func(context.Context, idem.Run) ([]byte, error),
	cw *captureWriter, ev *Event) (res idem.Result, err error) {
	panicking := true
	defer func() {
		if !panicking {
			return
		}
		ev.Outcome, ev.Status = OutcomePanic, http.StatusInternalServerError
		if !m.cfg.RecoverPanics {
			return // the panic continues on its own
		}
		v := recover()
		if v == http.ErrAbortHandler {
			panic(v)
		}
		m.cfg.Logger.Error("idemhttp: handler panicked; key released", "scope_hash", scopeHash(call.Scope), "key", call.Key, "panic", v)
		if !cw.streaming {
			m.errorFunc(cw.rw, r, newProblem(http.StatusInternalServerError, TypeHandlerPanic, "Internal error",
				errors.New("the request failed and was not recorded; it may be retried")))
		}
	}()
	res, err = m.guard.Do(r.Context(), call, fn)
	panicking = false
	return res, err
}

func (m *Middleware) reject(w http.ResponseWriter, r *http.Request, p *Problem, o Outcome, ev *Event) {
	ev.Outcome, ev.Status = o, p.Status
	m.errorFunc(w, r, p)
}

func (m *Middleware) discarded(w http.ResponseWriter, r *http.Request, ev *Event) {
	p := newProblem(http.StatusGone, TypeResultDiscarded, "Response not available", idem.ErrResultDiscarded)
	m.reject(w, r, p, OutcomeDiscarded, ev)
}

func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, value []byte, ev *Event) {
	sr, err := decodeResponse(value)
	if err != nil {
		m.reject(w, r, newProblem(http.StatusInternalServerError, TypeStoredResponseInvalid, "Stored response invalid", err),
			OutcomeError, ev)
		return
	}
	if sr.discarded {
		m.discarded(w, r, ev)
		return
	}
	h := w.Header()
	for k, vs := range sr.header {
		h[k] = slices.Clone(vs)
	}
	h.Set(ReplayedHeader, "true")
	h.Set("Content-Length", strconv.Itoa(len(sr.body)))
	w.WriteHeader(sr.status)
	_, _ = w.Write(sr.body)
	ev.Outcome, ev.Status = OutcomeReplayed, sr.status
}
