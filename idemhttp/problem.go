package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem type URIs. They are stable: clients may switch on them. Each
// names one case; the HTTP status that goes with it is in brackets.
const (
	// TypeKeyMissing: the route requires an Idempotency-Key and none was sent [400].
	TypeKeyMissing = "https://idem-go.dev/problems/key-missing"
	// TypeKeyInvalid: the key header is repeated, is not an sf-string or
	// bare token, or the key is not 1–255 bytes of printable ASCII [400].
	TypeKeyInvalid = "https://idem-go.dev/problems/key-invalid"
	// TypeScopeMissing: no authenticated principal could be determined for a
	// key-carrying request, so the key cannot be scoped safely [400].
	TypeScopeMissing = "https://idem-go.dev/problems/scope-missing"
	// TypeBodyTooLarge: the request body exceeds Config.MaxBodyBytes [413].
	TypeBodyTooLarge = "https://idem-go.dev/problems/body-too-large"
	// TypeBodyInvalid: a JSON content type with a body that is not valid
	// JSON, or a body that could not be read [400].
	TypeBodyInvalid = "https://idem-go.dev/problems/body-invalid"
	// TypeKeyInFlight: the first request with this key is still running;
	// retry after Retry-After seconds [409].
	TypeKeyInFlight = "https://idem-go.dev/problems/key-in-flight"
	// TypeKeyReused: the key was used before with a different request [422].
	TypeKeyReused = "https://idem-go.dev/problems/key-reused"
	// TypeResultDiscarded: the request with this key completed but its
	// response was too large to store; it will not run again and its
	// response cannot be replayed [410].
	TypeResultDiscarded = "https://idem-go.dev/problems/result-discarded"
	// TypeStoreUnavailable: the idempotency store could not be reached;
	// nothing ran [503].
	TypeStoreUnavailable = "https://idem-go.dev/problems/store-unavailable"
	// TypeStoredResponseInvalid: the stored response could not be decoded [500].
	TypeStoredResponseInvalid = "https://idem-go.dev/problems/stored-response-invalid"
	// TypeHandlerPanic: the handler panicked and Config.RecoverPanics is set;
	// the key was released [500].
	TypeHandlerPanic = "https://idem-go.dev/problems/handler-panic"
	// TypeUpstreamUnreachable: the proxy could not reach its upstream; the
	// key was released [502].
	TypeUpstreamUnreachable = "https://idem-go.dev/problems/upstream-unreachable"
	// TypeUpstreamTimeout: the upstream did not answer in time; the key was
	// released [504].
	TypeUpstreamTimeout = "https://idem-go.dev/problems/upstream-timeout"
)

// Problem is an RFC 9457 problem detail. It is also the error that
// [Middleware.Check] returns, so callers can inspect or render it.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// RetryAfter, when positive, is sent as a Retry-After header.
	RetryAfter time.Duration `json:"-"`
	// Err is the underlying error (often an idem sentinel), for errors.Is.
	Err error `json:"-"`
}

func (p *Problem) Error() string {
	s := "idemhttp: " + p.Title
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	return s
}

// Unwrap returns the underlying error.
func (p *Problem) Unwrap() error { return p.Err }

func newProblem(status int, typ, title string, err error) *Problem {
	p := &Problem{Type: typ, Title: title, Status: status, Err: err}
	if err != nil {
		p.Detail = err.Error()
	}
	return p
}

// WriteProblem writes p as application/problem+json. It is the default
// Config.ErrorHandler.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil {
		// Only strings and an int are marshalled; this cannot fail.
		http.Error(w, p.Title, p.Status)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
