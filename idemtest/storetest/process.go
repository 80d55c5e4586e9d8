package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// processScope is the scope of the suite's messages (a consumer name).
const processScope = "storetest-consumer"

// errHandler is the failure the suite's handlers return.
var errHandler = errors.New("storetest: handler failed on purpose")

// processTest is one subtest of the transactional-path suite.
type processTest struct {
	name string
	run  func(t *testing.T, env ProcessEnv)
}

var processTests = []processTest{
	{"NewThenDuplicate", testProcessNewThenDuplicate},
	{"HandlerFailure", testProcessHandlerFailure},
	{"Mismatch", testProcessMismatch},
	{"RetentionWindow", testProcessRetentionWindow},
	{"Acceptance", testProcessAcceptance},
	{"Batch", testProcessBatch},
	{"BatchHandlerFailure", testProcessBatchHandlerFailure},
	{"ConcurrentBatches", testProcessConcurrentBatches},
	{"InvalidInput", testProcessInvalidInput},
	{"CanceledContext", testProcessCanceledContext},
}

func runProcess(t *testing.T, newEnv func(t *testing.T) ProcessEnv) {
	t.Run("Process", func(t *testing.T) {
		for _, pt := range processTests {
			t.Run(pt.name, func(t *testing.T) {
				t.Parallel()
				pt.run(t, newEnv(t))
			})
		}
	})
}

// msg returns a message whose fingerprint is derived from version, so that
// the same key with another version is a different payload.
func msg(key, version string) idem.Message {
	return idem.Message{Scope: processScope, Key: key, Fingerprint: fp(key + "@" + version)}
}

// process runs env.Process with a nil failure and fails the test on an error.
func process(t *testing.T, env ProcessEnv, m idem.Message, want idem.Outcome, contract string) {
	t.Helper()
	res, err := env.Process(context.Background(), m, nil)
	if err != nil {
		t.Fatalf("contract: %s: Process(key %q) returned an error: %v", contract, m.Key, err)
	}
	if res != want {
		t.Fatalf("contract: %s: Process(key %q) want %v, got %v", contract, m.Key, want, res)
	}
}

// effects returns the effect rows per key.
func effects(t *testing.T, env ProcessEnv) map[string]int {
	t.Helper()
	e, err := env.Effects(context.Background())
	if err != nil {
		t.Fatalf("Effects: %v", err)
	}
	return e
}

// wantEffects fails unless the effect rows per key are exactly want.
func wantEffects(t *testing.T, env ProcessEnv, want map[string]int, contract string) {
	t.Helper()
	got := effects(t, env)
	bad := 0
	for k, n := range want {
		if got[k] != n {
			if bad < 10 {
				t.Errorf("contract: %s: key %q has %d effects, want %d", contract, k, got[k], n)
			}
			bad++
		}
	}
	for k, n := range got {
		if _, ok := want[k]; !ok && n != 0 {
			if bad < 10 {
				t.Errorf("contract: %s: key %q has %d unexpected effects", contract, k, n)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("contract: %s: %d keys have the wrong number of effects", contract, bad)
	}
}

func testProcessNewThenDuplicate(t *testing.T, env ProcessEnv) {
	m := msg("order-1", "v1")
	process(t, env, m, idem.Processed, "a new message is processed")
	wantEffects(t, env, map[string]int{"order-1": 1}, "a processed message has exactly one effect")
	process(t, env, m, idem.Duplicate, "the same message again is a duplicate")
	process(t, env, m, idem.Duplicate, "the same message a third time is a duplicate")
	wantEffects(t, env, map[string]int{"order-1": 1}, "a duplicate adds no effect")
}

func testProcessHandlerFailure(t *testing.T, env ProcessEnv) {
	m := msg("order-1", "v1")
	res, err := env.Process(context.Background(), m, errHandler)
	if !errors.Is(err, errHandler) {
		t.Errorf("contract: a failing handler's error is returned wrapped: want %q, got %v", errHandler, err)
	}
	if res == idem.Processed {
		t.Error("contract: a message whose handler failed is not Processed")
	}
	wantEffects(t, env, map[string]int{}, "a failing handler's effect is rolled back")
	process(t, env, m, idem.Processed, "a message whose handler failed is not recorded, so a redelivery runs")
	wantEffects(t, env, map[string]int{"order-1": 1}, "the redelivery's effect")
}

func testProcessMismatch(t *testing.T, env ProcessEnv) {
	process(t, env, msg("order-1", "v1"), idem.Processed, "a new message is processed")
	res, err := env.Process(context.Background(), msg("order-1", "v2"), nil)
	if res != idem.Mismatch || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Errorf("contract: the same key with another fingerprint is Mismatch with an error wrapping ErrFingerprintMismatch, got %v, %v", res, err)
	}
	wantEffects(t, env, map[string]int{"order-1": 1}, "a mismatched message has no effect")
	process(t, env, msg("order-1", "v1"), idem.Duplicate, "the original payload is still a duplicate after a mismatch")
}

func testProcessRetentionWindow(t *testing.T, env ProcessEnv) {
	m := msg("order-1", "v1")
	m.Retention = shortTTL
	process(t, env, m, idem.Processed, "a new message is processed")
	process(t, env, m, idem.Duplicate, "inside its window a message is a duplicate")
	time.Sleep(expiryWait)
	process(t, env, m, idem.Processed, "after its dedupe window a message counts as new")
	wantEffects(t, env, map[string]int{"order-1": 2}, "a message processed again after its window has a second effect")
	process(t, env, m, idem.Duplicate, "the new record opens a new window")
}

// retryer runs operations again while they fail with a retryable error
// (idem.IsRetryable), and counts how often it had to.
type retryer struct {
	retries atomic.Int64
}

const maxAttempts = 100

func (r *retryer) do(ctx context.Context, op func() error) error {
	for attempt := 1; ; attempt++ {
		err := op()
		if err == nil || !idem.IsRetryable(err) || attempt == maxAttempts {
			return err
		}
		r.retries.Add(1)
		// Full jitter keeps contending goroutines from retrying in step.
		select {
		case <-time.After(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// newRand returns a seeded random source and logs the seed, so a failing
// order can be replayed.
func newRand(t *testing.T) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed))
}

const (
	acceptanceMessages   = 1000
	acceptanceDeliveries = 3
	acceptanceWorkers    = 32
)

// testProcessAcceptance is the mission's acceptance test: every message
// delivered several times, in random order, to parallel consumers, has
// exactly one effect.
func testProcessAcceptance(t *testing.T, env ProcessEnv) {
	rng := newRand(t)
	deliveries := make(chan idem.Message, acceptanceMessages*acceptanceDeliveries)
	want := make(map[string]int, acceptanceMessages)
	var all []idem.Message
	for i := range acceptanceMessages {
		m := msg(fmt.Sprintf("msg-%04d", i), "v1")
		want[m.Key] = 1
		for range acceptanceDeliveries {
			all = append(all, m)
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for _, m := range all {
		deliveries <- m
	}
	close(deliveries)

	ctx := context.Background()
	var (
		r                    retryer
		processed, duplicate atomic.Int64
		failures             atomic.Int64
		wg                   sync.WaitGroup
	)
	for range acceptanceWorkers {
		wg.Go(func() {
			for m := range deliveries {
				var res idem.Outcome
				err := r.do(ctx, func() error {
					var err error
					res, err = env.Process(ctx, m, nil)
					return err
				})
				switch {
				case err != nil:
					if failures.Add(1) <= 10 {
						t.Errorf("contract: a delivery of %q failed with a non-retryable error (or %d retryable ones): %v", m.Key, maxAttempts, err)
					}
				case res == idem.Processed:
					processed.Add(1)
				case res == idem.Duplicate:
					duplicate.Add(1)
				default:
					t.Errorf("contract: a redelivery of the same payload is Processed or Duplicate, %q got %v", m.Key, res)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d deliveries by %d goroutines: %d processed, %d duplicates, %d retried errors",
		len(all), acceptanceWorkers, processed.Load(), duplicate.Load(), r.retries.Load())
	if failures.Load() > 0 {
		t.Fatalf("%d deliveries failed", failures.Load())
	}
	if processed.Load() != acceptanceMessages || duplicate.Load() != acceptanceMessages*(acceptanceDeliveries-1) {
		t.Errorf("contract: %d messages delivered %d times each must give %d Processed and %d Duplicate, got %d and %d",
			acceptanceMessages, acceptanceDeliveries, acceptanceMessages, acceptanceMessages*(acceptanceDeliveries-1), processed.Load(), duplicate.Load())
	}
	wantEffects(t, env, want, "every message delivered several times to parallel consumers has exactly one effect")
}

// expectBatch returns the results a sequential reading of msgs gives when
// seen already holds the fingerprints of the keys processed before: the
// first occurrence of a new key is Processed, a later one with the same
// fingerprint a Duplicate, with another a Mismatch.
func expectBatch(seen map[string]idem.Fingerprint, msgs []idem.Message) []idem.Outcome {
	want := make([]idem.Outcome, len(msgs))
	for i, m := range msgs {
		f, ok := seen[m.Key]
		switch {
		case !ok:
			want[i] = idem.Processed
			seen[m.Key] = m.Fingerprint
		case f == m.Fingerprint:
			want[i] = idem.Duplicate
		default:
			want[i] = idem.Mismatch
		}
	}
	return want
}

// processBatch runs env.ProcessBatch with a nil failure. A batch with
// mismatched messages may report them with a nil error or with one wrapping
// ErrFingerprintMismatch; any other error fails the test.
func processBatch(t *testing.T, env ProcessEnv, msgs []idem.Message) []idem.Outcome {
	t.Helper()
	res, err := env.ProcessBatch(context.Background(), msgs, nil)
	if err != nil && !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("ProcessBatch of %d messages: %v", len(msgs), err)
	}
	if len(res) != len(msgs) {
		t.Fatalf("contract: ProcessBatch returns one result per message: %d messages, %d results", len(msgs), len(res))
	}
	return res
}

func wantResults(t *testing.T, msgs []idem.Message, got, want []idem.Outcome, contract string) {
	t.Helper()
	bad := 0
	for i := range want {
		if got[i] != want[i] {
			if bad < 10 {
				t.Errorf("contract: %s: message %d (key %q) want %v, got %v", contract, i, msgs[i].Key, want[i], got[i])
			}
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("contract: %s: %d of %d results are wrong", contract, bad, len(want))
	}
}

// batchFixture processes some keys one by one and returns a shuffled batch
// that mixes duplicates of them, mismatches of them, fresh keys, and
// fresh keys repeated inside the batch with the same and with another
// fingerprint.
func batchFixture(t *testing.T, env ProcessEnv, rng *rand.Rand) (seen map[string]idem.Fingerprint, batch []idem.Message) {
	seen = make(map[string]idem.Fingerprint)
	for i := range 30 {
		m := msg(fmt.Sprintf("before-%02d", i), "v1")
		process(t, env, m, idem.Processed, "a new message is processed")
		seen[m.Key] = m.Fingerprint
	}
	for i := range 20 {
		batch = append(batch, msg(fmt.Sprintf("before-%02d", i), "v1"))
	}
	for i := 20; i < 30; i++ {
		batch = append(batch, msg(fmt.Sprintf("before-%02d", i), "v2"))
	}
	for i := range 60 {
		batch = append(batch, msg(fmt.Sprintf("fresh-%02d", i), "v1"))
	}
	for i := range 8 {
		batch = append(batch, msg(fmt.Sprintf("fresh-%02d", i), "v1"))
	}
	batch = append(batch, msg("fresh-08", "v2"), msg("fresh-09", "v2"))
	rng.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
	return seen, batch
}

func testProcessBatch(t *testing.T, env ProcessEnv) {
	seen, batch := batchFixture(t, env, newRand(t))
	want := expectBatch(seen, batch)
	got := processBatch(t, env, batch)
	wantResults(t, batch, got, want, "a batch is judged message by message, earlier messages of the batch included")

	wantN := make(map[string]int)
	for k := range seen {
		wantN[k] = 1
	}
	wantEffects(t, env, wantN, "the batch handler is handed only the fresh messages, each once")
	counts := make(map[idem.Outcome]int)
	for _, r := range got {
		counts[r]++
	}
	t.Logf("batch of %d: %v processed, %v duplicates, %v mismatched", len(batch), counts[idem.Processed], counts[idem.Duplicate], counts[idem.Mismatch])

	again := processBatch(t, env, batch)
	for i, r := range again {
		if r == idem.Processed {
			t.Errorf("contract: a batch delivered again processes nothing, message %d (key %q) was Processed", i, batch[i].Key)
		}
	}
	wantEffects(t, env, wantN, "a batch delivered again adds no effect")

	if res, err := env.ProcessBatch(context.Background(), nil, nil); err != nil || len(res) != 0 {
		t.Errorf("contract: an empty batch is a no-op, got %v, %v", res, err)
	}
}

func testProcessBatchHandlerFailure(t *testing.T, env ProcessEnv) {
	seen, batch := batchFixture(t, env, newRand(t))
	before := effects(t, env)
	res, err := env.ProcessBatch(context.Background(), batch, errHandler)
	if !errors.Is(err, errHandler) {
		t.Errorf("contract: a failing batch handler's error is returned wrapped: want %q, got %v", errHandler, err)
	}
	for i, r := range res {
		if r == idem.Processed {
			t.Errorf("contract: no message of a batch whose handler failed is Processed, message %d (key %q) was", i, batch[i].Key)
		}
	}
	wantEffects(t, env, before, "a failing batch handler rolls back every effect")

	// Nothing was recorded, so the batch runs again in full.
	want := expectBatch(seen, batch)
	got := processBatch(t, env, batch)
	wantResults(t, batch, got, want, "a batch whose handler failed is not recorded, so a redelivery runs")
}

const (
	concurrentBatchWorkers = 8
	concurrentBatchRounds  = 4
	concurrentBatchKeys    = 200
	concurrentBatchSize    = 50
)

func testProcessConcurrentBatches(t *testing.T, env ProcessEnv) {
	rng := newRand(t)
	batches := make([][]idem.Message, concurrentBatchWorkers*concurrentBatchRounds)
	for g := range concurrentBatchWorkers {
		for r := range concurrentBatchRounds {
			// Windows that slide by a quarter batch per worker overlap
			// every other worker's.
			first := g*concurrentBatchSize/2 + r*concurrentBatchSize
			b := make([]idem.Message, concurrentBatchSize)
			for i := range b {
				b[i] = msg(fmt.Sprintf("key-%03d", (first+i)%concurrentBatchKeys), "v1")
			}
			rng.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
			batches[g*concurrentBatchRounds+r] = b
		}
	}
	ctx := context.Background()
	var (
		rt        retryer
		processed atomic.Int64
		wg        sync.WaitGroup
	)
	gate, open := start()
	for g := range concurrentBatchWorkers {
		wg.Go(func() {
			<-gate
			for r := range concurrentBatchRounds {
				b := batches[g*concurrentBatchRounds+r]
				var res []idem.Outcome
				err := rt.do(ctx, func() error {
					var err error
					res, err = env.ProcessBatch(ctx, b, nil)
					return err
				})
				if err != nil {
					t.Errorf("contract: concurrent batches over overlapping keys must not fail (retryable errors are retried): %v", err)
					return
				}
				if len(res) != len(b) {
					t.Errorf("contract: ProcessBatch returns one result per message: %d messages, %d results", len(b), len(res))
					return
				}
				for i, r := range res {
					switch r {
					case idem.Processed:
						processed.Add(1)
					case idem.Duplicate:
					default:
						t.Errorf("contract: overlapping batches of one payload give Processed or Duplicate, key %q got %v", b[i].Key, r)
					}
				}
			}
		})
	}
	open()
	wg.Wait()
	t.Logf("%d batches of %d from %d goroutines: %d processed, %d retried errors",
		len(batches), concurrentBatchSize, concurrentBatchWorkers, processed.Load(), rt.retries.Load())
	want := make(map[string]int, concurrentBatchKeys)
	for i := range concurrentBatchKeys {
		want[fmt.Sprintf("key-%03d", i)] = 1
	}
	wantEffects(t, env, want, "concurrent batches over overlapping keys give every key exactly one effect")
	if processed.Load() != concurrentBatchKeys {
		t.Errorf("contract: each of the %d keys is Processed exactly once across concurrent batches, got %d Processed", concurrentBatchKeys, processed.Load())
	}
}

func testProcessInvalidInput(t *testing.T, env ProcessEnv) {
	ctx := context.Background()
	cases := []struct {
		what string
		msg  idem.Message
		want error
	}{
		{"an empty key", idem.Message{Scope: processScope}, idem.ErrInvalidKey},
		{"a key with a newline", msg("a\nb", "v1"), idem.ErrInvalidKey},
		{"a 256-byte key", msg(strings.Repeat("k", idem.MaxKeyLen+1), "v1"), idem.ErrInvalidKey},
		{"an invalid UTF-8 scope", idem.Message{Scope: "\xff", Key: "k"}, idem.ErrInvalidScope},
		{"a negative retention", idem.Message{Scope: processScope, Key: "k", Retention: -time.Second}, idem.ErrInvalidConfig},
	}
	for _, tc := range cases {
		res, err := env.Process(ctx, tc.msg, nil)
		if !errors.Is(err, tc.want) || res == idem.Processed {
			t.Errorf("contract: Process rejects %s with %q, got %v, %v", tc.what, tc.want, res, err)
		}
		res2, err := env.ProcessBatch(ctx, []idem.Message{msg("valid", "v1"), tc.msg}, nil)
		if !errors.Is(err, tc.want) {
			t.Errorf("contract: ProcessBatch rejects a batch holding %s with %q, got %v", tc.what, tc.want, err)
		}
		for _, r := range res2 {
			if r == idem.Processed {
				t.Errorf("contract: no message of a rejected batch is Processed")
			}
		}
	}
	wantEffects(t, env, map[string]int{}, "rejected messages and batches have no effect")
	process(t, env, msg("valid", "v1"), idem.Processed, "the valid message of a rejected batch was not recorded")
}

func testProcessCanceledContext(t *testing.T, env ProcessEnv) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := env.Process(ctx, msg("canceled", "v1"), nil)
	if err == nil || res == idem.Processed {
		t.Errorf("contract: Process with a cancelled context must fail, got %v, %v", res, err)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("Process with a cancelled context returned %v, which does not wrap context.Canceled (allowed)", err)
	}
	res2, err := env.ProcessBatch(ctx, []idem.Message{msg("canceled", "v1")}, nil)
	if err == nil {
		t.Errorf("contract: ProcessBatch with a cancelled context must fail, got %v", res2)
	} else if !errors.Is(err, context.Canceled) {
		t.Logf("ProcessBatch with a cancelled context returned %v, which does not wrap context.Canceled (allowed)", err)
	}
	wantEffects(t, env, map[string]int{}, "a cancelled Process has no effect")
	process(t, env, msg("canceled", "v1"), idem.Processed, "a cancelled Process recorded nothing")
}
