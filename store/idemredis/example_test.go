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
	store, err := idemredis.New(ctx, client, &idemredis.Config{
		Prefix: "example:" + fmt.Sprint(time.Now().UnixNano()) + ":",
		Strict: true, // refuse a server that may evict records
	})
	if err != nil {
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
