package sdktest

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/stripe/stripe-go/v82"
)

// goRetries is the stripe-go client's MaxNetworkRetries: a request the SDK
// considers retryable is sent 1+goRetries times.
const goRetries = 3

// newStripeClient returns a real stripe-go client whose API backend is the
// server at url. hc may be nil.
//
// The backend's sleep between retries is switched off with the SDK's own
// SetNetworkRetriesSleep (what stripe-go's test suite does): it only
// changes how long the SDK waits before a retry, never whether it retries,
// and keeps the tests fast on a loaded machine.
func newStripeClient(t *testing.T, url string, hc *http.Client) *stripe.Client {
	t.Helper()
	if hc == nil {
		hc = &http.Client{Timeout: 2 * waitLimit}
	}
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(url),
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(goRetries),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	bi, ok := b.(*stripe.BackendImplementation)
	if !ok {
		t.Fatalf("stripe.GetBackendWithConfig returned %T", b)
	}
	bi.SetNetworkRetriesSleep(false)
	return stripe.NewClient("sk_test_sdktest_go", stripe.WithBackends(&stripe.Backends{
		API: b, Connect: b, Uploads: b, MeterEvents: b,
	}))
}

// customerParams returns create params with the given key ("" for none).
func customerParams(key, email, description string) *stripe.CustomerCreateParams {
	p := &stripe.CustomerCreateParams{Email: stripe.String(email), Description: stripe.String(description)}
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// TestFakeIsNotIdempotent is the control: without idemhttp, the same call
// with the same Idempotency-Key creates two customers. Whatever
// deduplication the other tests see comes from idemhttp.
func TestFakeIsNotIdempotent(t *testing.T) {
	e := newEnv(t, bare, "")
	sc := newStripeClient(t, e.URL, nil)
	ctx := testContext(t)
	c1, err := sc.V1Customers.Create(ctx, customerParams("control-1", "a@example.com", "control"))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := sc.V1Customers.Create(ctx, customerParams("control-1", "a@example.com", "control"))
	if err != nil {
		t.Fatal(err)
	}
	if c1.ID == c2.ID || c1.LastResponse.RequestID == c2.LastResponse.RequestID || e.fake.executions.Load() != 2 {
		t.Fatalf("the fake must create a new customer per call: ids %s %s, request ids %s %s, executions %d",
			c1.ID, c2.ID, c1.LastResponse.RequestID, c2.LastResponse.RequestID, e.fake.executions.Load())
	}
	if got := c2.LastResponse.Header.Get("Idempotency-Key"); got != "" {
		t.Fatalf("the fake echoes Idempotency-Key %q itself; the echo checks below would prove nothing", got)
	}
}

// TestStripeGoReplay: a create with an idempotency key runs once; the same
// call again returns the same customer, and the SDK exposes the original
// Request-Id, the echoed key and Idempotent-Replayed.
func TestStripeGoReplay(t *testing.T) {
	for _, m := range modes {
		t.Run(string(m), func(t *testing.T) {
			e := newEnv(t, m, idemhttp.FormatStripe)
			sc := newStripeClient(t, e.URL, nil)
			ctx := testContext(t)
			const key = "order-1001"

			c1, err := sc.V1Customers.Create(ctx, customerParams(key, "jenny@example.com", "first"))
			if err != nil {
				t.Fatal(err)
			}
			r1 := c1.LastResponse
			if c1.ID == "" || !strings.HasPrefix(r1.RequestID, "req_") {
				t.Fatalf("first create: id %q, request id %q", c1.ID, r1.RequestID)
			}
			if r1.IdempotencyKey != key || r1.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first create: LastResponse.IdempotencyKey %q (want %q), Idempotent-Replayed %q (want none)",
					r1.IdempotencyKey, key, r1.Header.Get("Idempotent-Replayed"))
			}

			c2, err := sc.V1Customers.Create(ctx, customerParams(key, "jenny@example.com", "first"))
			if err != nil {
				t.Fatal(err)
			}
			r2 := c2.LastResponse
			if c2.ID != c1.ID {
				t.Fatalf("replay returned customer %s, the original was %s", c2.ID, c1.ID)
			}
			if r2.RequestID != r1.RequestID {
				t.Fatalf("replay's LastResponse.RequestID = %q, the original's was %q", r2.RequestID, r1.RequestID)
			}
			if r2.IdempotencyKey != key || r2.Header.Get("Idempotency-Key") != key {
				t.Fatalf("replay: LastResponse.IdempotencyKey %q, header %q; want %q", r2.IdempotencyKey, r2.Header.Get("Idempotency-Key"), key)
			}
			if got := r2.Header.Get(idemhttp.ReplayedHeader); got != "true" {
				t.Fatalf("replay: %s = %q, want true", idemhttp.ReplayedHeader, got)
			}
			if r2.StatusCode != http.StatusOK || c2.Email != "jenny@example.com" {
				t.Fatalf("replay: status %d, email %q", r2.StatusCode, c2.Email)
			}
			if n := e.fake.executions.Load(); n != 1 {
				t.Fatalf("the fake ran %d times, want 1", n)
			}
			if n := e.attempts.Load(); n != 2 {
				t.Fatalf("the SDK sent %d requests, want 2", n)
			}

			// Another key is another customer: the replay above is not a
			// cache of the route.
			c3, err := sc.V1Customers.Create(ctx, customerParams("order-1002", "jenny@example.com", "first"))
			if err != nil {
				t.Fatal(err)
			}
			if c3.ID == c1.ID || c3.LastResponse.RequestID == r1.RequestID || e.fake.executions.Load() != 2 {
				t.Fatalf("a new key must create a new customer: %s vs %s", c3.ID, c1.ID)
			}
		})
	}
}

// dropKey is an http.RoundTripper that removes the Idempotency-Key header,
// as a gateway or client library that does not forward it would. stripe-go
// itself always sends one on a POST.
type dropKey struct{ next http.RoundTripper }

func (d dropKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Del("Idempotency-Key")
	return d.next.RoundTrip(r)
}

// errorCase is one idemhttp error as stripe-go sees it, in both formats.
type errorCase struct {
	name string
	// run provokes the error; it returns the number of HTTP requests the
	// SDK sent for the call that failed, and the SDK's error.
	run func(t *testing.T, e *env) (int64, error)

	// The stripe format's expectations.
	typ        stripe.ErrorType
	code       string
	status     int
	shouldRtry string // Stripe-Should-Retry
	docURL     string
}

// call runs one create and counts the requests it sent.
func call(t *testing.T, e *env, sc *stripe.Client, p *stripe.CustomerCreateParams) (*stripe.Customer, int64, error) {
	t.Helper()
	before := e.attempts.Load()
	c, err := sc.V1Customers.Create(testContext(t), p)
	return c, e.attempts.Load() - before, err
}

var errorCases = []errorCase{
	{
		name: "key_reused",
		run: func(t *testing.T, e *env) (int64, error) {
			sc := newStripeClient(t, e.URL, nil)
			if _, _, err := call(t, e, sc, customerParams("reuse-1", "a@example.com", "first")); err != nil {
				t.Fatal(err)
			}
			_, n, err := call(t, e, sc, customerParams("reuse-1", "b@example.com", "first"))
			return n, err
		},
		typ: stripe.ErrorTypeIdempotency, code: "idempotency_key_reused", status: http.StatusBadRequest,
		shouldRtry: "false", docURL: idemhttp.TypeKeyReused,
	},
	{
		name: "key_in_use",
		run: func(t *testing.T, e *env) (int64, error) {
			sc := newStripeClient(t, e.URL, nil)
			type result struct {
				c   *stripe.Customer
				err error
			}
			first := make(chan result, 1)
			firstCtx := testContext(t)
			go func() {
				c, err := sc.V1Customers.Create(firstCtx, customerParams("busy-1", "a@example.com", holdDescription))
				first <- result{c, err}
			}()
			ctx, cancel := context.WithTimeout(t.Context(), waitLimit)
			defer cancel()
			if err := e.fake.waitEntered(ctx); err != nil {
				t.Fatalf("the first request never reached the handler: %v", err)
			}
			_, n, err := call(t, e, sc, customerParams("busy-1", "a@example.com", holdDescription))

			// The first request completes once released; its response is
			// what the key replays from then on.
			e.fake.releaseHeld()
			var r result
			select {
			case r = <-first:
			case <-time.After(2 * waitLimit):
				t.Fatal("the first request did not finish")
			}
			if r.err != nil {
				t.Fatalf("first request: %v", r.err)
			}
			again, _, err2 := call(t, e, sc, customerParams("busy-1", "a@example.com", holdDescription))
			if err2 != nil || again.ID != r.c.ID || again.LastResponse.RequestID != r.c.LastResponse.RequestID {
				t.Fatalf("after the first request finished: %v, id %v (want %s)", err2, again, r.c.ID)
			}
			if x := e.fake.executions.Load(); x != 1 {
				t.Fatalf("the fake ran %d times, want 1", x)
			}
			return n, err
		},
		typ: stripe.ErrorTypeIdempotency, code: "idempotency_key_in_use", status: http.StatusConflict,
		shouldRtry: "true", docURL: idemhttp.TypeKeyInFlight,
	},
	{
		name: "key_missing",
		run: func(t *testing.T, e *env) (int64, error) {
			sc := newStripeClient(t, e.URL, &http.Client{Timeout: 2 * waitLimit, Transport: dropKey{http.DefaultTransport}})
			_, n, err := call(t, e, sc, customerParams("", "a@example.com", "first"))
			return n, err
		},
		typ: stripe.ErrorTypeInvalidRequest, code: "idempotency_key_missing", status: http.StatusBadRequest,
		shouldRtry: "false", docURL: idemhttp.TypeKeyMissing,
	},
	{
		name: "key_invalid",
		run: func(t *testing.T, e *env) (int64, error) {
			sc := newStripeClient(t, e.URL, nil)
			_, n, err := call(t, e, sc, customerParams("not a token", "a@example.com", "first"))
			return n, err
		},
		typ: stripe.ErrorTypeInvalidRequest, code: "idempotency_key_invalid", status: http.StatusBadRequest,
		shouldRtry: "false", docURL: idemhttp.TypeKeyInvalid,
	},
	{
		name: "store_unavailable",
		run: func(t *testing.T, e *env) (int64, error) {
			sc := newStripeClient(t, e.URL, nil)
			_, n, err := call(t, e, sc, customerParams(storeDownPrefix+"1", "a@example.com", "first"))
			if x := e.fake.executions.Load(); x != 0 {
				t.Fatalf("the fake ran %d times with the store down, want 0", x)
			}
			return n, err
		},
		typ: stripe.ErrorTypeAPI, code: "idempotency_store_unavailable", status: http.StatusServiceUnavailable,
		shouldRtry: "true", docURL: idemhttp.TypeStoreUnavailable,
	},
}

// TestStripeGoErrorsStripeFormat: with FormatStripe every idemhttp error
// reaches stripe-go as a typed *stripe.Error (the wrapped typed error for
// errors.As: *stripe.IdempotencyError, *stripe.InvalidRequestError,
// *stripe.APIError) with Stripe's type, code and status, after exactly one
// HTTP request.
//
// stripe-go never retries a response it could parse as a Stripe error
// (Error.canRetry is true only for 429 lock_timeout), and its retry
// decision consults that before Stripe-Should-Retry: so even the 409
// idempotency_key_in_use and the 503, which say Stripe-Should-Retry: true,
// are returned after one attempt, as Stripe's own 409 would be. The
// Node SDK, which honours the header, retries those (see node_test.go).
func TestStripeGoErrorsStripeFormat(t *testing.T) {
	for _, m := range modes {
		for _, ec := range errorCases {
			t.Run(string(m)+"/"+ec.name, func(t *testing.T) {
				e := newEnv(t, m, idemhttp.FormatStripe)
				attempts, err := ec.run(t, e)
				var se *stripe.Error
				if !errors.As(err, &se) {
					t.Fatalf("want a *stripe.Error, got %T: %v", err, err)
				}
				if se.Type != ec.typ || string(se.Code) != ec.code || se.HTTPStatusCode != ec.status || se.DocURL != ec.docURL {
					t.Fatalf("got type %q code %q status %d doc_url %q; want %q %q %d %q",
						se.Type, se.Code, se.HTTPStatusCode, se.DocURL, ec.typ, ec.code, ec.status, ec.docURL)
				}
				if se.Msg == "" {
					t.Fatal("the error has no message")
				}
				if got := se.LastResponse.Header.Get("Stripe-Should-Retry"); got != ec.shouldRtry {
					t.Fatalf("Stripe-Should-Retry = %q, want %q", got, ec.shouldRtry)
				}
				if ct := se.LastResponse.Header.Get("Content-Type"); ct != "application/json" {
					t.Fatalf("Content-Type = %q", ct)
				}
				switch ec.typ {
				case stripe.ErrorTypeIdempotency:
					var ie *stripe.IdempotencyError
					if !errors.As(err, &ie) {
						t.Fatalf("errors.As(*stripe.IdempotencyError) failed for %v", err)
					}
				case stripe.ErrorTypeInvalidRequest:
					var ire *stripe.InvalidRequestError
					if !errors.As(err, &ire) {
						t.Fatalf("errors.As(*stripe.InvalidRequestError) failed for %v", err)
					}
				case stripe.ErrorTypeAPI:
					var ae *stripe.APIError
					if !errors.As(err, &ae) {
						t.Fatalf("errors.As(*stripe.APIError) failed for %v", err)
					}
				}
				if attempts != 1 {
					t.Fatalf("stripe-go sent %d requests, want exactly 1 (no retry of a typed error)", attempts)
				}
				t.Logf("stripe format, %s: stripe-go returned *stripe.Error type=%s code=%s status=%d after %d request(s)",
					m, se.Type, se.Code, se.HTTPStatusCode, attempts)
			})
		}
	}
}

// TestStripeGoErrorsProblemFormat records why FormatStripe exists: with
// the default RFC 9457 problem+json, the body has no "error" member, so
// stripe-go cannot read it as a Stripe error. It returns an untyped error
// whose text is the body (no *stripe.Error, no status, no type), and —
// because an error that is not a Stripe error counts as a network problem
// — retries every one of them, including the 4xx that cannot succeed:
// 1+MaxNetworkRetries requests for each case.
func TestStripeGoErrorsProblemFormat(t *testing.T) {
	for _, m := range modes {
		for _, ec := range errorCases {
			t.Run(string(m)+"/"+ec.name, func(t *testing.T) {
				e := newEnv(t, m, idemhttp.FormatProblem)
				attempts, err := ec.run(t, e)
				if err == nil {
					t.Fatal("want an error")
				}
				var se *stripe.Error
				if errors.As(err, &se) {
					t.Fatalf("problem+json became a *stripe.Error (%+v); the contrast this test records is gone", se)
				}
				if !strings.Contains(err.Error(), ec.docURL) {
					t.Fatalf("the untyped error should carry the problem body, got %v", err)
				}
				if attempts != 1+goRetries {
					t.Fatalf("stripe-go sent %d requests, want %d (it retries an error it cannot parse)", attempts, 1+goRetries)
				}
				t.Logf("problem format, %s: stripe-go returned untyped %T after %d requests: %.90s…",
					m, err, attempts, err.Error())
			})
		}
	}
}
