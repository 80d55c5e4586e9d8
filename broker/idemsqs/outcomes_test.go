package idemsqs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
)

// The engine's other outcomes on SQS: a permanent error and a payload
// mismatch are dead-lettered at once (on a FIFO queue, to its FIFO
// dead-letter queue), and a commit whose outcome is unknown is handed back
// to SQS and its redelivery deduped.
func TestOutcomes(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			t.Parallel()
			c := sqsClient(t)
			suffix := ""
			if fifo {
				suffix = ".fifo"
			}
			q := newQueue(t, c, t.Name()+suffix, map[string]string{"VisibilityTimeout": "5"})
			dlq := newQueue(t, c, t.Name()+"-dlq"+suffix, nil)
			var (
				mu      sync.Mutex
				calls   = map[string]int{}
				applied = map[string]bool{}
			)
			process := func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
				mu.Lock()
				defer mu.Unlock()
				body := string(d.Body())
				calls[body]++
				switch {
				case body == "permanent":
					return "", retry.Permanent(errors.New("invalid order"))
				case body == "unknown" && calls[body] == 1:
					applied[msg.Key] = true
					return "", fmt.Errorf("commit: %w", idem.ErrCommitUnknown)
				case body == "changed":
					return idem.Mismatch, nil
				case applied[msg.Key]:
					return idem.Duplicate, nil
				}
				applied[msg.Key] = true
				return idem.Processed, nil
			}
			var counters consume.Counters
			runConsumer(t, newConsumer(t, c, q, dlq, process, func(cfg *idemsqs.Config) {
				cfg.Concurrency = 1
				cfg.Hooks = []idem.Hook{&counters}
				cfg.Retry = &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 3}
			}))
			send := func(id, body, group string) {
				// Its own deduplication id: SQS would drop a second
				// send of m-1 on a FIFO queue.
				publish(t, c, q, idemsqs.Message{Body: body, ID: id, GroupID: group, DeduplicationID: id + "-" + body})
			}
			send("p-1", "permanent", "g1")
			send("u-1", "unknown", "g2")
			send("m-1", "original", "g3")
			waitFor(t, 30*time.Second, "the first three settled", func() bool { return queueDepth(t, c, q) == 0 })
			send("m-1", "changed", "g3")
			waitFor(t, 30*time.Second, "everything settled", func() bool { return queueDepth(t, c, q) == 0 && queueDepth(t, c, dlq) == 2 })

			if !fifo {
				// goaws hides a FIFO dead-letter queue's groups after a
				// listing (its group lock outlives ChangeMessageVisibility
				// 0): the FIFO case checks the counts only.
				// Listed again until both show: goaws may hand the messages
				// to a receive that already returned empty, hiding them for
				// its 30 s visibility timeout (seen once: depth 2, listing 0).
				var dead []idemsqs.DeadMessage
				waitFor(t, 90*time.Second, "both dead letters listed", func() bool {
					var err error
					dead, err = idemsqs.ListDeadLetters(context.Background(), c, dlq, 10)
					if err != nil {
						t.Fatalf("ListDeadLetters: %v", err)
					}
					return len(dead) == 2
				})
				reasons := map[string]idem.DeadReason{}
				for _, m := range dead {
					reasons[m.ID] = m.Reason
					// A mismatch is not a failed attempt.
					if want := map[string]int{"p-1": 1, "m-1": 0}[m.ID]; m.Attempts != want {
						t.Errorf("%s dead-lettered after %d attempts, want %d", m.ID, m.Attempts, want)
					}
				}
				if reasons["p-1"] != idem.DeadPermanent || reasons["m-1"] != idem.DeadMismatch {
					t.Errorf("reasons %v", reasons)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if calls["permanent"] != 1 || calls["unknown"] != 2 {
				t.Errorf("calls %v: want the permanent error once and the unknown commit redelivered once", calls)
			}
			s := counters.Snapshot()
			if s.Requeued != 1 || s.Duplicate != 1 || s.DeadLettered != 2 || s.Processed != 1 {
				t.Errorf("counters %+v", s)
			}
		})
	}
}
