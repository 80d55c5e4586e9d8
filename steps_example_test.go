package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// A ride is booked in three steps: create the ride, charge the card, send
// the receipt. The mailer fails the first time; the client's retry resumes
// after the last recorded step, so the card is charged once.
func ExampleSteps() {
	// In production use a durable store (idemsqlite, idempgx, idemmysql, idemredis).
	store := idemtest.NewMemoryStore(nil)
	g := idem.NewGuard(store, nil)

	charges, mails := 0, 0
	mailerDown := true
	book := func(ctx context.Context, run idem.Run) ([]byte, error) {
		steps := idem.StepsOf(run)
		ride, err := steps.Do(ctx, "create-ride", func(ctx context.Context, st idem.Step) ([]byte, error) {
			return []byte("ride_1"), nil // with SQL stores: idem.DoTx, in the same transaction
		})
		if err != nil {
			return nil, err
		}
		charge, err := steps.Do(ctx, "charge", func(ctx context.Context, st idem.Step) ([]byte, error) {
			// Send st.DownstreamKey as the gateway's Idempotency-Key: a
			// crash between the charge and its record is deduplicated there.
			charges++
			return []byte("ch_1"), nil
		})
		if err != nil {
			return nil, err
		}
		if _, err := steps.Do(ctx, "receipt", func(ctx context.Context, st idem.Step) ([]byte, error) {
			if mailerDown {
				mailerDown = false
				return nil, errors.New("mailer: connection refused")
			}
			mails++
			return nil, nil
		}); err != nil {
			return nil, err // the key is released; the steps stay recorded
		}
		return fmt.Appendf(nil, "%s paid by %s", ride, charge), nil
	}

	req := idem.Call{Scope: "rider:7", Key: "book-42", Fingerprint: idem.FingerprintBytes([]byte(`{"from":"A","to":"B"}`))}
	for attempt := 1; attempt <= 3; attempt++ {
		res, err := g.Do(context.Background(), req, book)
		fmt.Printf("attempt %d: %q replayed=%v err=%v\n", attempt, res.Value, res.Replayed, err)
	}
	recorded, _ := store.Steps(context.Background(), req.Scope, req.Key)
	for _, st := range recorded {
		fmt.Printf("step %d %s: %q\n", st.Seq, st.Name, st.Result)
	}
	fmt.Println("charges:", charges, "mails:", mails)
	// Output:
	// attempt 1: "" replayed=false err=mailer: connection refused
	// attempt 2: "ride_1 paid by ch_1" replayed=false err=<nil>
	// attempt 3: "ride_1 paid by ch_1" replayed=true err=<nil>
	// step 1 create-ride: "ride_1"
	// step 2 charge: "ch_1"
	// step 3 receipt: ""
	// charges: 1 mails: 1
}
