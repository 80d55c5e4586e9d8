package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Bounds of the HTTP exercise.
const (
	maxDemoRequests = 1000
	// demoChargeTime is how long the payment handler works, so that the
	// retries arrive while the first request is still in flight.
	demoChargeTime = 100 * time.Millisecond
	// demoWait is how long an in-flight retry waits for the original
	// response before the middleware answers 409.
	demoWait = 2 * time.Second
	// demoMaxConflicts bounds the retries of one request that got 409.
	demoMaxConflicts = 20
)

// httpDemoResult is the outcome of the HTTP exercise.
type httpDemoResult struct {
	Requests int
	// Charges is how many times the payment handler ran.
	Charges int64
	// Originals is how many final responses were not replays (1 when
	// correct), and Status is the original's status.
	Originals int
	Status    int
	// Identical is how many replays match the original byte for byte
	// (status, body, Location).
	Identical int
	// Conflicts is how many 409s (still in flight) were seen and retried.
	Conflicts int
}

// demoResponse is what a client kept of one final response.
type demoResponse struct {
	status   int
	body     []byte
	location string
	replayed bool
}

// runPaymentRetries starts the payments API behind the idemhttp middleware
// on store, over loopback HTTP, and sends it requests copies of one payment
// with one Idempotency-Key at once: a client retrying a timed-out POST, many
// times over. A 409 (the original still running after the middleware's
// wait) is retried until it replays. key must be unique to this run.
func runPaymentRetries(ctx context.Context, store idem.Store, key string, requests int) (httpDemoResult, error) {
	res := httpDemoResult{Requests: requests}
	mw, err := idemhttp.New(store, &idemhttp.Config{
		Principal:  func(*http.Request) (string, error) { return "demo-customer", nil },
		RequireKey: true,
		Wait:       demoWait,
		Logger:     slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return res, fmt.Errorf("demo: middleware: %w", err)
	}
	var charges atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		select {
		case <-time.After(demoChargeTime):
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/ch_"+strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","amount_cents":4200,"currency":"usd","status":"succeeded"}`+"\n", n)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(charge))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	transport := &http.Transport{MaxIdleConnsPerHost: requests}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport, Timeout: demoWait + 5*time.Second}

	body := []byte(`{"amount_cents": 4200, "currency": "usd", "card": "tok_visa"}`)
	responses := make([]demoResponse, requests)
	errs := make([]error, requests)
	var conflicts atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			<-start
			for attempt := 1; ; attempt++ {
				r, err := postPayment(ctx, client, srv.URL+"/payments", key, body)
				if err != nil {
					errs[i] = err
					return
				}
				if r.status != http.StatusConflict || attempt == demoMaxConflicts {
					responses[i] = r
					return
				}
				conflicts.Add(1)
				time.Sleep(demoChargeTime / 2)
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return res, fmt.Errorf("demo: payment request: %w", err)
		}
	}
	res.Charges, res.Conflicts = charges.Load(), int(conflicts.Load())
	res.Originals, res.Status, res.Identical = compareResponses(responses)
	return res, nil
}

func postPayment(ctx context.Context, client *http.Client, url, key string, body []byte) (demoResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return demoResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", strconv.Quote(key))
	resp, err := client.Do(req)
	if err != nil {
		return demoResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return demoResponse{}, err
	}
	return demoResponse{
		status:   resp.StatusCode,
		body:     b,
		location: resp.Header.Get("Location"),
		replayed: resp.Header.Get("Idempotent-Replayed") == "true",
	}, nil
}

// compareResponses finds the original (the one response that is not a
// replay) and counts the replays identical to it.
func compareResponses(rs []demoResponse) (originals, status, identical int) {
	var orig *demoResponse
	for i := range rs {
		if !rs[i].replayed {
			originals++
			if orig == nil {
				orig = &rs[i]
			}
		}
	}
	if orig == nil {
		return 0, 0, 0
	}
	for i := range rs {
		r := &rs[i]
		if r != orig && r.replayed && r.status == orig.status && r.location == orig.location && bytes.Equal(r.body, orig.body) {
			identical++
		}
	}
	return originals, orig.status, identical
}

// httpVerdict returns nil when the payment was charged once and every
// retry got the original response, and an error saying what went wrong
// otherwise.
func httpVerdict(r httpDemoResult) error {
	var bad []string
	if r.Charges != 1 {
		bad = append(bad, fmt.Sprintf("%d charges for one payment", r.Charges))
	}
	if r.Originals != 1 {
		bad = append(bad, fmt.Sprintf("%d original responses, want 1", r.Originals))
	} else if r.Status != http.StatusCreated {
		bad = append(bad, fmt.Sprintf("the original response is %d, want 201", r.Status))
	}
	if want := r.Requests - 1; r.Identical != want {
		bad = append(bad, fmt.Sprintf("%d of %d retries replayed the original response", r.Identical, want))
	}
	if len(bad) > 0 {
		return fmt.Errorf("demo failed: %s", strings.Join(bad, "; "))
	}
	return nil
}

// writeHTTPTable prints r as the second table.
func writeHTTPTable(w io.Writer, r httpDemoResult) {
	tableRow(w, "parallel requests", strconv.Itoa(r.Requests), "one payment, one Idempotency-Key")
	chargeNote := "exact"
	if r.Charges != 1 {
		chargeNote = "WRONG: want 1"
	}
	tableRow(w, "charges", strconv.FormatInt(r.Charges, 10), chargeNote)
	tableRow(w, "identical replays", strconv.Itoa(r.Identical),
		fmt.Sprintf("of %d; same status and byte-identical body as the original", max(r.Requests-1, 0)))
	tableRow(w, "409s seen", strconv.Itoa(r.Conflicts), "in flight past the wait; retried until they replayed")
}
