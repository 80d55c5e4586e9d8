package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemtest"
)

// A handler made of steps: idem.StepsFrom gives it the recovery points of
// its execution. The mailer fails the first time, so the response is a
// 503 and the key is released; the client's retry resumes after the
// recorded steps, so the card is charged once. With idemsqlite or idempgx
// the first step would be idem.DoTx, in the same transaction as its row
// (see store/idemsqlite's steps_crash_test.go, which SIGKILLs the server
// between every pair of steps).
func ExampleMiddleware_steps() {
	store := idemtest.NewMemoryStore(nil) // production: a durable store
	mw, err := idemhttp.New(store, &idemhttp.Config{
		Principal:       idemhttp.PrincipalFromHeader("X-User"),
		AllowNonDurable: true,
	})
	if err != nil {
		panic(err)
	}
	charges, mailerDown := 0, true
	book := func(w http.ResponseWriter, r *http.Request) {
		steps := idem.StepsFrom(r.Context())
		ride, err := steps.Do(r.Context(), "create-ride", func(ctx context.Context, st idem.Step) ([]byte, error) {
			return []byte("ride_1"), nil
		})
		var charge []byte
		if err == nil {
			charge, err = steps.Do(r.Context(), "charge", func(ctx context.Context, st idem.Step) ([]byte, error) {
				charges++ // send st.DownstreamKey as the card processor's Idempotency-Key
				return []byte("ch_1"), nil
			})
		}
		if err == nil {
			_, err = steps.Do(r.Context(), "receipt", func(ctx context.Context, st idem.Step) ([]byte, error) {
				if mailerDown {
					mailerDown = false
					return nil, errors.New("mailer unavailable")
				}
				return nil, nil
			})
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // 5xx: released, steps kept
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"ride":%q,"charge":%q}`, ride, charge)
	}
	h := mw.Handler(http.HandlerFunc(book))
	for range 3 {
		r := httptest.NewRequest(http.MethodPost, "/rides", strings.NewReader(`{"from":"A","to":"B"}`))
		r.Header.Set("X-User", "rider-7")
		r.Header.Set("Idempotency-Key", `"book-42"`)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()))
	}
	fmt.Println("charges:", charges)
	// Output:
	// 503 mailer unavailable
	// 201 {"ride":"ride_1","charge":"ch_1"}
	// 201 {"ride":"ride_1","charge":"ch_1"}
	// charges: 1
}
