package idemtest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// A unit test drives the store with a manual clock: a completed operation
// replays until its retention passes, then the key is free again.
func ExampleNewMemoryStore() {
	ctx := context.Background()
	clock := idemtest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := idemtest.NewMemoryStore(&idemtest.MemoryOptions{Now: clock.Now})
	req := idem.ClaimRequest{Scope: "payments", Key: "order-42", Lease: time.Minute}

	c, _ := store.Claim(ctx, req)
	fmt.Println(c.Outcome, c.Token)
	_ = store.Complete(ctx, idem.CompleteRequest{
		Scope: "payments", Key: "order-42", Token: c.Token,
		Result: []byte("charged"), Retention: 24 * time.Hour,
	})

	c, _ = store.Claim(ctx, req)
	fmt.Println(c.Outcome, string(c.Record.Result))

	clock.Advance(24 * time.Hour)
	c, _ = store.Claim(ctx, req)
	fmt.Println(c.Outcome, c.Token)
	fmt.Println("durable:", store.Durable())
	// Output:
	// acquired 1
	// completed charged
	// acquired 2
	// durable: false
}
