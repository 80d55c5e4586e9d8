package idem_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// A payment that a client retries three times is charged once; the retries
// get the stored result.
func ExampleGuard_Do() {
	// In production use a durable store (idemsqlite, idempgx, idemredis).
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, nil)

	charges := 0
	charge := func(ctx context.Context, run idem.Run) ([]byte, error) {
		// Pass run.DownstreamKey("charge") to the payment gateway so that a
		// takeover after a crash cannot charge twice either.
		charges++
		return []byte("charge ch_1 succeeded"), nil
	}

	req := idem.Call{Scope: "user:42", Key: "order-7", Fingerprint: idem.FingerprintBytes([]byte(`{"amount":500}`))}
	for attempt := 1; attempt <= 3; attempt++ {
		res, err := g.Do(context.Background(), req, charge)
		fmt.Printf("attempt %d: %s (replayed=%v, err=%v)\n", attempt, res.Value, res.Replayed, err)
	}
	fmt.Println("charges:", charges)
	// Output:
	// attempt 1: charge ch_1 succeeded (replayed=false, err=<nil>)
	// attempt 2: charge ch_1 succeeded (replayed=true, err=<nil>)
	// attempt 3: charge ch_1 succeeded (replayed=true, err=<nil>)
	// charges: 1
}

func ExampleFingerprintJSON() {
	a, _ := idem.FingerprintJSON([]byte(`{"amount": 500, "currency": "EUR"}`))
	b, _ := idem.FingerprintJSON([]byte(`{"currency":"EUR","amount":500}`))
	c, _ := idem.FingerprintJSON([]byte(`{"currency":"EUR","amount":501}`))
	fmt.Println(a == b, a == c)
	// Output: true false
}
