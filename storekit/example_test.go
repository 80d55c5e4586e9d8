package storekit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// A store keeps the leases of a batch while its handler runs: a lost lease
// cancels the handler's context, and nothing may be recorded after it.
func ExampleKeep() {
	ctx := context.Background()
	extendAll := func(ctx context.Context) error { return nil } // one round trip for every lease

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	k := storekit.Keep(ctx, storekit.KeeperConfig{
		Lease:     300 * time.Millisecond,
		Extend:    extendAll,
		OnLost:    cancel,
		LogPrefix: "mystore: process batch",
	})
	handler := func(ctx context.Context) error {
		time.Sleep(250 * time.Millisecond) // longer than Lease/3: a heartbeat or two go out
		return ctx.Err()
	}
	err := handler(runCtx)
	if lost := k.Stop(); lost != nil {
		err = errors.Join(err, lost) // do not record: another caller may hold the key
	}
	count, _ := k.Stats()
	fmt.Println(err, count > 0)
	// Output: <nil> true
}

// A store judges the record that blocked its insert of a dedupe record.
func ExampleJudge() {
	msg := idem.Message{Scope: "billing", Key: "m-1", Fingerprint: idem.FingerprintBytes([]byte("a"))}
	stored := storekit.Existing{State: idem.StateCompleted, Fingerprint: msg.Fingerprint}
	out, retry, err := storekit.Judge(stored, msg)
	fmt.Println(out, retry, err)
	// Output: duplicate false <nil>
}
