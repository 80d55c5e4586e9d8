package idemredis_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

// A Guard over Redis runs a function once per key and replays its result.
// The store takes the application's own rueidis client.
func Example() {
	url := os.Getenv("IDEM_REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		log.Fatal(err)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
	store, err := idemredis.New(client, &idemredis.Config{
		Prefix: "example:" + fmt.Sprint(time.Now().UnixNano()) + ":",
		Strict: true, // refuse a server that may evict records
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Ping(ctx); err != nil { // New does no I/O; Ping checks the server
		log.Fatal(err)
	}
	guard := idem.NewGuard(store, &idem.GuardConfig{Retention: time.Minute})

	sends := 0
	for range 3 { // the same notification delivered three times
		res, err := guard.Do(ctx, idem.Call{Scope: "notifier", Key: "welcome-mail-42"},
			func(ctx context.Context, run idem.Run) ([]byte, error) {
				sends++
				return []byte("sent"), nil
			})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (replayed: %v)\n", res.Value, res.Replayed)
	}
	fmt.Println("mails sent:", sends)
	_ = store.Delete(ctx, "notifier", "welcome-mail-42")
	// Prints (it needs a Redis server, so go test does not check it):
	// sent (replayed: false)
	// sent (replayed: true)
	// sent (replayed: true)
	// mails sent: 1
}

// A consumer that receives a batch claims it in one round trip, runs the
// effects of the messages it acquired, and completes them in one more.
// Repeats within the batch and messages already done are skipped.
func ExampleStore_ClaimBatch() {
	opt, err := rueidis.ParseURL("redis://127.0.0.1:6379/0")
	if err != nil {
		log.Fatal(err)
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	store, err := idemredis.New(client, &idemredis.Config{Prefix: "example:" + fmt.Sprint(time.Now().UnixNano()) + ":"})
	if err != nil {
		log.Fatal(err)
	}

	batch := []string{"order-1", "order-2", "order-1", "order-3"} // order-1 delivered twice
	reqs := make([]idem.ClaimRequest, len(batch))
	for i, id := range batch {
		reqs[i] = idem.ClaimRequest{Scope: "shipping", Key: id, Lease: 30 * time.Second}
	}
	claims, err := store.ClaimBatch(ctx, reqs)
	if err != nil {
		log.Fatal(err) // the server is unreachable: retry the whole batch later
	}
	var done []idem.CompleteRequest
	for i, c := range claims {
		switch {
		case c.Err != nil:
			log.Printf("%s: %v", batch[i], c.Err) // this message alone
		case c.Outcome == idem.Acquired:
			fmt.Println("ship", batch[i]) // the effect
			done = append(done, idem.CompleteRequest{Scope: "shipping", Key: batch[i], Token: c.Token,
				Result: []byte("shipped"), Retention: 24 * time.Hour})
		default:
			fmt.Println("skip", batch[i], c.Outcome)
		}
	}
	errs, err := store.CompleteBatch(ctx, done)
	if err != nil {
		log.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			log.Printf("%s: %v", done[i].Key, err) // ErrLeaseLost: another worker took it over
		}
	}
	// Prints (it needs a Redis server, so go test does not check it):
	// ship order-1
	// ship order-2
	// skip order-1 in_progress
	// ship order-3
}
