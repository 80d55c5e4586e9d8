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

// An operator's question, "which scopes hold this key?", asked of any store
// that implements idem.Lister: page until the cursor is empty (a page may
// be short, or empty, while more records follow).
func ExampleMemoryStore_List() {
	ctx := context.Background()
	store := idemtest.NewMemoryStore(nil)
	for _, scope := range []string{"payments", "refunds", `http "alice" POST POST /pay`} {
		_, _ = store.Claim(ctx, idem.ClaimRequest{Scope: scope, Key: "order-42", Lease: time.Minute})
	}
	_, _ = store.Claim(ctx, idem.ClaimRequest{Scope: "payments", Key: "order-43", Lease: time.Minute})

	var lister idem.Lister = store
	req := idem.ListRequest{Filter: idem.ListFilter{Key: "order-42"}, Limit: 2}
	for {
		page, err := lister.List(ctx, req)
		if err != nil {
			panic(err)
		}
		for _, r := range page.Records {
			fmt.Printf("%q %s %s\n", r.Scope, r.State, idem.ScopeHash(r.Scope))
		}
		if page.Next == "" {
			break
		}
		req.Cursor = page.Next
	}
	// Output:
	// "http \"alice\" POST POST /pay" in_progress d61af406956734af
	// "payments" in_progress df384ae97c77ad30
	// "refunds" in_progress 4fdc1db8ceef1064
}
