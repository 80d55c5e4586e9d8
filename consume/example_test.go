package consume_test

import (
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
)

func ExampleCheckRetention() {
	err := consume.CheckRetention(time.Hour, 8, 10*time.Minute,
		consume.Window{Name: "queue x-message-ttl", D: 30 * time.Minute})
	fmt.Println(err)
	// Output:
	// idem: invalid configuration: dedupe retention 1h0m0s is shorter than the redelivery horizon 1h20m0s (max_attempts 8 × max_backoff 10m0s); a late duplicate would be processed twice: raise the retention above 1h20m0s
}

func ExampleDeadLetter_Headers() {
	dl := consume.DeadLetter{
		State:    consume.State{Attempts: 3, LastError: "gateway timeout"},
		Reason:   idem.DeadMaxAttempts,
		Consumer: "payments",
		Origin:   "orders/order.created",
	}
	h := dl.Headers()
	fmt.Println(h[consume.HeaderReason], h[consume.HeaderAttempts], h[consume.HeaderConsumer], h[consume.HeaderOrigin], h[consume.HeaderLastError])
	// Output: max_attempts 3 payments orders/order.created gateway timeout
}
