package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/retry"
)

func ExamplePolicy_Ceiling() {
	p := &retry.Policy{Base: time.Second, Cap: 30 * time.Second}
	for attempt := range 7 {
		fmt.Println(attempt, p.Ceiling(attempt))
	}
	// Output:
	// 0 1s
	// 1 2s
	// 2 4s
	// 3 8s
	// 4 16s
	// 5 30s
	// 6 30s
}

func ExampleClassify() {
	invalid := retry.Permanent(errors.New("amount must be positive"))
	outage := idem.Retryable(errors.New("connection refused"))
	flaky := errors.New("gateway timeout")
	fmt.Println(retry.Classify(invalid))
	fmt.Println(retry.Classify(outage))
	fmt.Println(retry.Classify(flaky))
	// Output:
	// permanent
	// infrastructure
	// failure
}

func ExamplePolicy_Decide() {
	p := &retry.Policy{Base: time.Second, Cap: time.Minute, MaxAttempts: 3, Jitter: retry.NoJitter}
	flaky := errors.New("gateway timeout")
	for _, f := range []retry.Failures{{}, {Counted: 1}, {Counted: 2}} {
		d := p.Decide(f, flaky)
		fmt.Println(d.Class, d.GiveUp(), d.Reason, d.Delay)
	}
	outage := idem.Retryable(errors.New("connection refused"))
	fmt.Println(p.Decide(retry.Failures{Counted: 2, Infrastructure: 1}, outage).Delay)
	fmt.Println(p.Decide(retry.Failures{}, retry.Permanent(flaky)).Reason)
	// Output:
	// failure false  1s
	// failure false  2s
	// failure true max_attempts 0s
	// 8s
	// permanent
}

func ExampleDo() {
	p := &retry.Policy{Base: time.Millisecond, Cap: 10 * time.Millisecond, MaxAttempts: 3}
	runs := 0
	err := retry.Do(context.Background(), p, func(ctx context.Context) error {
		runs++
		if runs < 2 {
			return errors.New("temporary")
		}
		return nil
	})
	fmt.Println(runs, err)
	// Output: 2 <nil>
}
