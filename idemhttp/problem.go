package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem"
)

// Problem type URIs. They are stable: clients may switch on them. Each
// names one case; the HTTP status that goes with it is in brackets, and the
// short code (the problem's "code" member, and the Stripe form's
// error.code) in braces.
const (
	// TypeKeyMissing: the route requires an Idempotency-Key and none was
	// sent [400] {idempotency_key_missing}.
	TypeKeyMissing = "https://idem-go.dev/problems/key-missing"
	// TypeKeyInvalid: the key header is repeated, is not an sf-string or
	// bare token, or the key is not 1–255 bytes of printable ASCII [400]
	// {idempotency_key_invalid}.
	TypeKeyInvalid = "https://idem-go.dev/problems/key-invalid"
	// TypeScopeMissing: no authenticated principal could be determined for a
	// key-carrying request (none, or the principal header repeated), so the
	// key cannot be scoped safely [400] {idempotency_scope_missing}.
	TypeScopeMissing = "https://idem-go.dev/problems/scope-missing"
	// TypeBodyTooLarge: the request body, or the body once decoded from its
	// Content-Encoding, exceeds Config.MaxBodyBytes [413]
	// {request_body_too_large}.
	TypeBodyTooLarge = "https://idem-go.dev/problems/body-too-large"
	// TypeBodyInvalid: a JSON content type with a body that is not valid
	// JSON, a compressed body that does not decode, or a body that could not
	// be read [400] {request_body_invalid}.
	TypeBodyInvalid = "https://idem-go.dev/problems/body-invalid"
	// TypeBodyTimeout: the body did not arrive within the read deadline
	// (ProxyConfig.BodyReadTimeout) [408] {request_body_timeout}.
	TypeBodyTimeout = "https://idem-go.dev/problems/body-timeout"
	// TypeKeyInFlight: the first request with this key is still running;
	// retry after Retry-After seconds [409] {idempotency_key_in_use}.
	TypeKeyInFlight = "https://idem-go.dev/problems/key-in-flight"
	// TypeKeyReused: the key was used before with a different request [422;
	// 400 in the Stripe form] {idempotency_key_reused}.
	TypeKeyReused = "https://idem-go.dev/problems/key-reused"
	// TypeResultDiscarded: the request with this key completed but its
	// response was too large to store; it will not run again and its
	// response cannot be replayed [410] {idempotency_result_discarded}.
	TypeResultDiscarded = "https://idem-go.dev/problems/result-discarded"
	// TypeResponseNotRecordable: the request with this key completed with a
	// protocol switch (101, a hijacked connection), which cannot be
	// replayed; it will not run again [410]
	// {idempotency_response_not_recordable}.
	TypeResponseNotRecordable = "https://idem-go.dev/problems/response-not-recordable"
	// TypeStoreUnavailable: the idempotency store could not be reached;
	// nothing ran [503] {idempotency_store_unavailable}.
	TypeStoreUnavailable = "https://idem-go.dev/problems/store-unavailable"
	// TypeStoredResponseInvalid: the stored response could not be decoded
	// [500] {idempotency_stored_response_invalid}.
	TypeStoredResponseInvalid = "https://idem-go.dev/problems/stored-response-invalid"
	// TypeHandlerPanic: the handler panicked and Config.RecoverPanics is set;
	// the key was released [500] {internal_error}.
	TypeHandlerPanic = "https://idem-go.dev/problems/handler-panic"
	// TypeUpstreamUnreachable: the proxy could not deliver the request to
	// its upstream (connection refused, DNS, TLS); nothing was forwarded and
	// the key was released [502] {upstream_unreachable}.
	TypeUpstreamUnreachable = "https://idem-go.dev/problems/upstream-unreachable"
	// TypeUpstreamTimeout: connecting to the upstream timed out before the
	// request was sent; the key was released [504] {upstream_timeout}.
	TypeUpstreamTimeout = "https://idem-go.dev/problems/upstream-timeout"
	// TypeOutcomeUnknown: the request reached the upstream, which then did
	// not answer in time, closed the connection or broke off its response:
	// it may or may not have been executed. With ProxyConfig.InDoubt
	// InDoubtRecord (the default) this answer is recorded for the key and
	// replayed to every retry, which is not forwarded again [502, or 504
	// after a timeout] {idempotency_outcome_unknown}.
	TypeOutcomeUnknown = "https://idem-go.dev/problems/outcome-unknown"
)

// problemKinds gives each problem type its short code and its form in the
// Stripe error shape.
var problemKinds = map[string]struct {
	code string
	// stripeType and stripeStatus are the Stripe form's error.type and
	// HTTP status (0: the problem's own status).
	stripeType   string
	stripeStatus int
	// retry says whether repeating the same request may succeed
	// (Stripe-Should-Retry).
	retry bool
}{
	TypeKeyMissing:            {"idempotency_key_missing", "invalid_request_error", 0, false},
	TypeKeyInvalid:            {"idempotency_key_invalid", "invalid_request_error", 0, false},
	TypeScopeMissing:          {"idempotency_scope_missing", "invalid_request_error", 0, false},
	TypeBodyTooLarge:          {"request_body_too_large", "invalid_request_error", 0, false},
	TypeBodyInvalid:           {"request_body_invalid", "invalid_request_error", 0, false},
	TypeBodyTimeout:           {"request_body_timeout", "invalid_request_error", 0, true},
	TypeKeyInFlight:           {"idempotency_key_in_use", "idempotency_error", 0, true},
	TypeKeyReused:             {"idempotency_key_reused", "idempotency_error", http.StatusBadRequest, false},
	TypeResultDiscarded:       {"idempotency_result_discarded", "idempotency_error", 0, false},
	TypeResponseNotRecordable: {"idempotency_response_not_recordable", "idempotency_error", 0, false},
	TypeStoreUnavailable:      {"idempotency_store_unavailable", "api_error", 0, true},
	TypeStoredResponseInvalid: {"idempotency_stored_response_invalid", "api_error", 0, false},
	TypeHandlerPanic:          {"internal_error", "api_error", 0, true},
	TypeUpstreamUnreachable:   {"upstream_unreachable", "api_error", 0, true},
	TypeUpstreamTimeout:       {"upstream_timeout", "api_error", 0, true},
	TypeOutcomeUnknown:        {"idempotency_outcome_unknown", "api_error", 0, false},
}

// Problem is an RFC 9457 problem detail. It is also the error that
// [Middleware.Check] returns, so callers can inspect or render it.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Code is a short, stable identifier of Type (an extension member),
	// also the Stripe form's error.code.
	Code string `json:"code,omitempty"`
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
	p := &Problem{Type: typ, Title: title, Status: status, Err: err, Code: problemKinds[typ].code}
	if err != nil {
		p.Detail = err.Error()
	}
	return p
}

// ErrorFormat selects how the middleware writes its error responses.
type ErrorFormat string

const (
	// FormatProblem writes RFC 9457 application/problem+json (the default).
	FormatProblem ErrorFormat = "problem"
	// FormatStripe writes Stripe's error shape,
	// {"error":{"type":…,"code":…,"message":…}}, with the statuses Stripe
	// uses, so that Stripe-style SDKs raise their typed errors (an
	// idempotency_error for a reused or busy key) instead of treating the
	// body as a result or retrying a request that cannot succeed.
	FormatStripe ErrorFormat = "stripe"
)

// writer returns the error writer of f.
func (f ErrorFormat) writer() (func(http.ResponseWriter, *http.Request, *Problem), error) {
	switch f {
	case "", FormatProblem:
		return WriteProblem, nil
	case FormatStripe:
		return WriteStripeError, nil
	}
	return nil, fmt.Errorf("idemhttp: %w: unknown ErrorFormat %q (want %q or %q)", idem.ErrInvalidConfig, string(f), FormatProblem, FormatStripe)
}

// errorHeaders sets the headers every error response carries.
func errorHeaders(h http.Header, contentType string, n int, p *Problem) {
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(n))
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
	}
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
	errorHeaders(w.Header(), "application/problem+json", len(body), p)
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// stripeError is the body of Stripe's error responses.
type stripeError struct {
	Error struct {
		Type    string `json:"type"`
		Code    string `json:"code,omitempty"`
		Message string `json:"message"`
		DocURL  string `json:"doc_url,omitempty"`
	} `json:"error"`
}

// WriteStripeError writes p in Stripe's error shape (see [FormatStripe]):
// error.type is idempotency_error for a busy or reused key,
// invalid_request_error for a request that is wrong as sent and api_error
// for a failure on the server's side; error.code is p.Code and
// error.doc_url p.Type. A Stripe-Should-Retry header says whether the
// same request may succeed later, as Stripe's SDKs expect.
func WriteStripeError(w http.ResponseWriter, _ *http.Request, p *Problem) {
	kind, known := problemKinds[p.Type]
	var e stripeError
	e.Error.Type, e.Error.Code, e.Error.DocURL = kind.stripeType, p.Code, p.Type
	if !known {
		e.Error.Type = "api_error"
		if p.Status < 500 {
			e.Error.Type = "invalid_request_error"
		}
	}
	e.Error.Message = p.Title
	if p.Detail != "" {
		e.Error.Message += ": " + p.Detail
	}
	status := p.Status
	if kind.stripeStatus != 0 {
		status = kind.stripeStatus
	}
	body, err := json.Marshal(&e)
	if err != nil {
		http.Error(w, p.Title, status)
		return
	}
	h := w.Header()
	errorHeaders(h, "application/json", len(body), p)
	if known {
		h.Set("Stripe-Should-Retry", strconv.FormatBool(kind.retry))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
