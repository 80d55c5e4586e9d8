package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// RunSteps runs the [idem.StepStore] conformance suite as parallel
// subtests of one subtest named "Steps", and returns when all of them have
// finished. newStore must return, once per subtest, an isolated store that
// implements idem.StepStore. opts may be nil.
//
// It checks steps recorded in order with the record's fingerprint, fencing
// (a stale, released, completed or missing lease gets idem.ErrLeaseLost),
// steps surviving Release and takeover, a second write of a name refused,
// the bounds (name, count, result size) and tombstones, Delete removing
// the steps, expiry and Purge, and two holders racing: a write by the
// holder whose lease was taken over either lands before the takeover (the
// new holder reads it right after its claim) or fails.
func RunSteps(t *testing.T, newStore func(t *testing.T) idem.Store, opts *Options) {
	t.Helper()
	c := newConfig(opts)
	tests := []struct {
		name string
		run  func(t *testing.T, s idem.Store, ss idem.StepStore, c config)
	}{
		{"RecordInOrder", testStepsInOrder},
		{"Fencing", testStepsFencing},
		{"SurviveReleaseAndTakeover", testStepsSurviveRelease},
		{"RecordedOnce", testStepsRecordedOnce},
		{"Bounds", testStepsBounds},
		{"Delete", testStepsDelete},
		{"Expiry", testStepsExpiry},
		{"RaceTakeover", testStepsRaceTakeover},
		{"RaceSameName", testStepsRaceSameName},
	}
	t.Run("Steps", func(t *testing.T) {
		for _, st := range tests {
			t.Run(st.name, func(t *testing.T) {
				t.Parallel()
				s := newStore(t)
				ss, ok := s.(idem.StepStore)
				if !ok {
					t.Fatalf("contract: %T must implement idem.StepStore to run RunSteps", s)
				}
				st.run(t, s, ss, c)
			})
		}
	})
}

func stepReq(key string, token int64, name string, result []byte) idem.StepRequest {
	return idem.StepRequest{Scope: scope, Key: key, Token: token, Name: name, Result: result, Retention: longRetention}
}

// recordStep runs RecordStep and fails the test on an error.
func recordStep(t *testing.T, ss idem.StepStore, req idem.StepRequest) idem.StepRecord {
	t.Helper()
	rec, err := ss.RecordStep(context.Background(), req)
	if err != nil {
		t.Fatalf("RecordStep(key %q, token %d, step %q) by the current holder: unexpected error: %v", req.Key, req.Token, req.Name, err)
	}
	return rec
}

// steps runs Steps and fails the test on an error.
func steps(t *testing.T, ss idem.StepStore, key string) []idem.StepRecord {
	t.Helper()
	recs, err := ss.Steps(context.Background(), scope, key)
	if err != nil {
		t.Fatalf("Steps(key %q): unexpected error: %v", key, err)
	}
	return recs
}

// stepNames lists the names of recs in order.
func stepNames(recs []idem.StepRecord) string {
	names := make([]string, len(recs))
	for i, r := range recs {
		names[i] = r.Name
	}
	return strings.Join(names, ",")
}

func testStepsInOrder(t *testing.T, s idem.Store, ss idem.StepStore, c config) {
	f := fp("order")
	cl := acquire(t, s, claimReq("order", f, longLease))
	if got := steps(t, ss, "order"); len(got) != 0 {
		t.Fatalf("contract: an operation without steps must have none, got %d", len(got))
	}
	before := time.Now()
	a := recordStep(t, ss, stepReq("order", cl.Token, "create-ride", []byte(`{"ride":1}`)))
	b := recordStep(t, ss, stepReq("order", cl.Token, "charge", []byte{}))
	if a.Seq != 1 || b.Seq != 2 {
		t.Errorf("contract: steps are numbered 1, 2, ... in the order recorded, got %d, %d", a.Seq, b.Seq)
	}
	got := steps(t, ss, "order")
	if stepNames(got) != "create-ride,charge" {
		t.Fatalf("contract: Steps returns the steps in the order recorded, got %q", stepNames(got))
	}
	for i, want := range []idem.StepRecord{a, b} {
		g := got[i]
		if g.Scope != scope || g.Key != "order" || g.Seq != i+1 || g.Token != cl.Token || g.Fingerprint != f || g.Tombstone {
			t.Errorf("contract: step %q must carry scope, key, its Seq, the token that wrote it and the record's fingerprint, got %+v", want.Name, g)
		}
		if !bytes.Equal(g.Result, want.Result) || g.Result == nil {
			t.Errorf("contract: step %q must read back its result byte for byte (an empty one not as nil), got %q, want %q", want.Name, g.Result, want.Result)
		}
		near(t, g.CreatedAt, before, clockSkew, "a step's CreatedAt is the store's now")
		near(t, g.ExpiresAt, g.CreatedAt.Add(longRetention), clockSkew, "a step expires retention after it was written")
	}
	if !got[0].ExpiresAt.Equal(got[1].ExpiresAt) {
		t.Errorf("contract: a step write moves every step of the operation to its ExpiresAt, got %v and %v", got[0].ExpiresAt, got[1].ExpiresAt)
	}
	if other := steps(t, ss, "order-other"); len(other) != 0 {
		t.Errorf("contract: steps belong to their own (scope, key), another key has %d", len(other))
	}
	if recs, err := ss.Steps(context.Background(), scope+"-other", "order"); err != nil || len(recs) != 0 {
		t.Errorf("contract: steps belong to their own scope, got %d steps, err %v", len(recs), err)
	}
	// A completed operation keeps its steps for operators.
	complete(t, s, "order", cl.Token, []byte("done"), longRetention)
	if got := steps(t, ss, "order"); len(got) != 2 {
		t.Errorf("contract: a completed operation keeps its steps, got %d", len(got))
	}
}

func wantStepLeaseLost(t *testing.T, ss idem.StepStore, key string, token int64, why string) {
	t.Helper()
	_, err := ss.RecordStep(context.Background(), stepReq(key, token, "late", []byte("x")))
	wantErr(t, err, idem.ErrLeaseLost, "RecordStep "+why)
}

func testStepsFencing(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	wantStepLeaseLost(t, ss, "fence-none", 1, "on a key without a record")

	cl := acquire(t, s, claimReq("fence", fp("fence"), longLease))
	wantStepLeaseLost(t, ss, "fence", cl.Token+1, "with a token that was never issued for the key")
	if err := s.Release(context.Background(), scope, "fence", cl.Token); err != nil {
		t.Fatal(err)
	}
	wantStepLeaseLost(t, ss, "fence", cl.Token, "after the lease was released")
	cl2 := acquire(t, s, claimReq("fence", fp("fence"), longLease))
	wantStepLeaseLost(t, ss, "fence", cl.Token, "with the token of an earlier lease")
	complete(t, s, "fence", cl2.Token, nil, longRetention)
	wantStepLeaseLost(t, ss, "fence", cl2.Token, "after the operation completed")
	if got := steps(t, ss, "fence"); len(got) != 0 {
		t.Errorf("contract: a refused RecordStep writes nothing, found %q", stepNames(got))
	}

	// An expired lease that nobody took over may still record, as Complete.
	cl3 := acquire(t, s, claimReq("fence-expired", fp("fence"), shortTTL))
	time.Sleep(expiryWait)
	if _, err := ss.RecordStep(context.Background(), stepReq("fence-expired", cl3.Token, "late", nil)); err != nil {
		t.Errorf("contract: an expired lease nobody took over may still record a step, got %v", err)
	}
}

func testStepsSurviveRelease(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	f := fp("survive")
	cl := acquire(t, s, claimReq("survive", f, longLease))
	recordStep(t, ss, stepReq("survive", cl.Token, "charge", []byte("ch_1")))
	if err := s.Release(context.Background(), scope, "survive", cl.Token); err != nil {
		t.Fatal(err)
	}
	if got := steps(t, ss, "survive"); stepNames(got) != "charge" {
		t.Fatalf("contract: steps survive Release (a retry must not run them again), got %q", stepNames(got))
	}
	cl2 := acquire(t, s, claimReq("survive", f, longLease))
	b := recordStep(t, ss, stepReq("survive", cl2.Token, "receipt", nil))
	if b.Seq != 2 || b.Token != cl2.Token {
		t.Errorf("contract: the next execution's step continues the sequence with its own token, got Seq %d token %d", b.Seq, b.Token)
	}

	// Takeover after an expired lease.
	cl3 := acquire(t, s, claimReq("survive-takeover", f, shortTTL))
	recordStep(t, ss, stepReq("survive-takeover", cl3.Token, "charge", []byte("ch_2")))
	time.Sleep(expiryWait)
	cl4 := acquire(t, s, claimReq("survive-takeover", f, longLease))
	if !cl4.Takeover {
		t.Fatalf("contract: claiming an expired lease is a takeover")
	}
	got := steps(t, ss, "survive-takeover")
	if stepNames(got) != "charge" || string(got[0].Result) != "ch_2" || got[0].Token != cl3.Token {
		t.Errorf("contract: steps survive a takeover as written, got %+v", got)
	}
	wantStepLeaseLost(t, ss, "survive-takeover", cl3.Token, "by a holder whose lease was taken over")

	// A new payload under the same key after a Release finds the steps of
	// the old one under its fingerprint, and may not add its own.
	if err := s.Release(context.Background(), scope, "survive", cl2.Token); err != nil {
		t.Fatal(err)
	}
	cl5 := acquire(t, s, claimReq("survive", fp("other payload"), longLease))
	if got := steps(t, ss, "survive"); len(got) != 2 || got[0].Fingerprint != f {
		t.Errorf("contract: steps keep the fingerprint of the payload that recorded them, got %+v", got)
	}
	_, err := ss.RecordStep(context.Background(), stepReq("survive", cl5.Token, "other", nil))
	wantErr(t, err, idem.ErrFingerprintMismatch, "RecordStep of a payload other than the one whose steps are recorded")
}

func testStepsRecordedOnce(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	cl := acquire(t, s, claimReq("once", fp("once"), longLease))
	recordStep(t, ss, stepReq("once", cl.Token, "charge", []byte("first")))
	_, err := ss.RecordStep(context.Background(), stepReq("once", cl.Token, "charge", []byte("second")))
	wantErr(t, err, idem.ErrStepRecorded, "a second write of a recorded step")
	got := steps(t, ss, "once")
	if len(got) != 1 || string(got[0].Result) != "first" {
		t.Errorf("contract: a refused second write changes nothing, got %+v", got)
	}
}

func testStepsBounds(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	ctx := context.Background()
	cl := acquire(t, s, claimReq("bounds", fp("bounds"), longLease))
	for _, name := range []string{"", strings.Repeat("n", idem.MaxStepNameLen+1), "has space", "semi;colon", "naïve", "tab\t"} {
		_, err := ss.RecordStep(ctx, stepReq("bounds", cl.Token, name, nil))
		wantErr(t, err, idem.ErrInvalidStep, fmt.Sprintf("step name %q", name))
	}
	recordStep(t, ss, stepReq("bounds", cl.Token, strings.Repeat("n", idem.MaxStepNameLen), nil))
	recordStep(t, ss, stepReq("bounds", cl.Token, "AZaz09-_.:", nil))

	_, err := ss.RecordStep(ctx, stepReq("bounds", cl.Token, "big", make([]byte, idem.MaxStepResultBytes+1)))
	wantErr(t, err, idem.ErrInvalidStep, "a result over MaxStepResultBytes")
	full := recordStep(t, ss, stepReq("bounds", cl.Token, "full", bytes.Repeat([]byte{0, 0xff}, idem.MaxStepResultBytes/2)))
	tomb := stepReq("bounds", cl.Token, "tomb", nil)
	tomb.Tombstone = true
	recordStep(t, ss, tomb)
	got := steps(t, ss, "bounds")
	if len(got) != 4 || !bytes.Equal(got[2].Result, full.Result) || len(got[2].Result) != idem.MaxStepResultBytes {
		t.Fatalf("contract: a result of exactly MaxStepResultBytes is kept byte for byte, got %d steps", len(got))
	}
	if !got[3].Tombstone || got[3].Result != nil {
		t.Errorf("contract: a tombstone step is recorded without a result, got %+v", got[3])
	}

	bad := stepReq("bounds", cl.Token, "x", nil)
	bad.Retention = 0
	_, err = ss.RecordStep(ctx, bad)
	wantErr(t, err, idem.ErrInvalidConfig, "a step retention of zero")
	bad = stepReq("", cl.Token, "x", nil)
	_, err = ss.RecordStep(ctx, bad)
	wantErr(t, err, idem.ErrInvalidKey, "RecordStep with an empty key")
	_, err = ss.Steps(ctx, scope, "")
	wantErr(t, err, idem.ErrInvalidKey, "Steps with an empty key")

	for i := len(got); i < idem.MaxSteps; i++ {
		recordStep(t, ss, stepReq("bounds", cl.Token, fmt.Sprintf("s%d", i), nil))
	}
	_, err = ss.RecordStep(ctx, stepReq("bounds", cl.Token, "one-too-many", nil))
	wantErr(t, err, idem.ErrInvalidStep, "a step beyond MaxSteps")
	if got := steps(t, ss, "bounds"); len(got) != idem.MaxSteps {
		t.Errorf("contract: an operation keeps at most MaxSteps steps, got %d", len(got))
	}
}

func testStepsDelete(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	ctx := context.Background()
	cl := acquire(t, s, claimReq("del", fp("del"), longLease))
	recordStep(t, ss, stepReq("del", cl.Token, "charge", nil))
	if err := s.Delete(ctx, scope, "del"); err != nil {
		t.Fatal(err)
	}
	if got := steps(t, ss, "del"); len(got) != 0 {
		t.Errorf("contract: Delete removes the record's steps, %q left", stepNames(got))
	}
	// Steps a Release left behind are deleted by Delete too.
	cl = acquire(t, s, claimReq("del-released", fp("del"), longLease))
	recordStep(t, ss, stepReq("del-released", cl.Token, "charge", nil))
	if err := s.Release(ctx, scope, "del-released", cl.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, scope, "del-released"); err != nil {
		t.Errorf("contract: Delete of a released operation that has steps deletes them (not ErrNotFound), got %v", err)
	}
	if got := steps(t, ss, "del-released"); len(got) != 0 {
		t.Errorf("contract: Delete removes the steps a Release left, %q left", stepNames(got))
	}
	wantErr(t, s.Delete(ctx, scope, "del-released"), idem.ErrNotFound, "Delete with neither record nor steps")
}

func testStepsExpiry(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	ctx := context.Background()
	cl := acquire(t, s, claimReq("expiry", fp("expiry"), longLease))
	short := stepReq("expiry", cl.Token, "a", nil)
	short.Retention = shortTTL
	recordStep(t, ss, short)
	short.Name = "b"
	recordStep(t, ss, short)
	if err := s.Release(ctx, scope, "expiry", cl.Token); err != nil {
		t.Fatal(err)
	}
	time.Sleep(expiryWait)
	if got := steps(t, ss, "expiry"); len(got) != 0 {
		t.Errorf("contract: expired steps count as absent, got %q", stepNames(got))
	}
	if _, err := s.Purge(ctx, 0); err != nil {
		t.Fatal(err)
	}
	cl = acquire(t, s, claimReq("expiry", fp("expiry"), longLease))
	if rec := recordStep(t, ss, stepReq("expiry", cl.Token, "b", nil)); rec.Seq != 1 {
		t.Errorf("contract: an operation whose steps expired starts again at Seq 1, got %d", rec.Seq)
	}
	if got := steps(t, ss, "expiry"); stepNames(got) != "b" {
		t.Errorf("contract: expired steps never come back, got %q", stepNames(got))
	}
}

// testStepsRaceTakeover races the writes of a holder whose lease expired
// with the claims that take it over: every write that succeeded must be
// in what the new holder reads right after its claim, so it never runs
// a step that was recorded.
func testStepsRaceTakeover(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	written := raceTakeover(t, s, ss, "race-steps", 8, 6, 16, func(key string, token int64, name string) error {
		_, err := ss.RecordStep(context.Background(), stepReq(key, token, name, []byte(name)))
		return err
	})
	if got := steps(t, ss, "race-steps"); len(got) != len(written) {
		t.Errorf("contract: exactly the successful writes are recorded: %d succeeded, %d recorded", len(written), len(got))
	}
	t.Logf("%d step writes of the old holder landed before the takeover", len(written))
}

// raceTakeover lets writers write perWriter steps each with the token of
// an expired lease on key while claimers race to take it over, once a
// first write has landed or failed, so that the race has writes on both
// sides of the takeover. It fails the test unless exactly one claim
// acquires and every write that succeeded is in what that claim's holder
// reads right after it, and returns the names written.
func raceTakeover(t *testing.T, s idem.Store, ss idem.StepStore, key string, writers, perWriter, claimers int,
	write func(key string, token int64, name string) error) []string {
	t.Helper()
	f := fp(key)
	old := acquire(t, s, claimReq(key, f, shortTTL))
	time.Sleep(expiryWait)
	gate, open := start()
	firstWrite := make(chan struct{})
	var (
		firstOnce sync.Once
		wg        sync.WaitGroup
		mu        sync.Mutex
		written   []string
		readBy    map[string]bool
		winners   int
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-gate
			for i := range perWriter {
				name := fmt.Sprintf("w%d-%d", w, i)
				err := write(key, old.Token, name)
				firstOnce.Do(func() { close(firstWrite) })
				mu.Lock()
				if err == nil {
					written = append(written, name)
				} else if !errors.Is(err, idem.ErrLeaseLost) {
					t.Errorf("unexpected error of a step write: %v", err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	for range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-firstWrite
			c, err := s.Claim(context.Background(), claimReq(key, f, longLease))
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			if c.Outcome != idem.Acquired {
				return
			}
			recs, err := ss.Steps(context.Background(), scope, key)
			mu.Lock()
			defer mu.Unlock()
			winners++
			if err != nil {
				t.Errorf("steps: %v", err)
				return
			}
			readBy = map[string]bool{}
			for _, r := range recs {
				readBy[r.Name] = true
			}
		}()
	}
	open()
	wg.Wait()
	if winners != 1 {
		t.Fatalf("contract: %d concurrent takeovers must give exactly one Acquired, got %d", claimers, winners)
	}
	for _, name := range written {
		if !readBy[name] {
			t.Errorf("contract: step %q of the old holder was written after the takeover's claim (the new holder did not see it): fencing must order step writes before the claim that takes over", name)
		}
	}
	return written
}

// testStepsRaceSameName races dozens of writes of one step name with the
// current token and with stale ones: only one write succeeds.
func testStepsRaceSameName(t *testing.T, s idem.Store, ss idem.StepStore, _ config) {
	const writers = 32
	f := fp("race-name")
	var stale []int64
	for range 4 {
		c := acquire(t, s, claimReq("race-name", f, longLease))
		if err := s.Release(context.Background(), scope, "race-name", c.Token); err != nil {
			t.Fatal(err)
		}
		stale = append(stale, c.Token)
	}
	cur := acquire(t, s, claimReq("race-name", f, longLease))
	gate, open := start()
	var (
		wg                   sync.WaitGroup
		mu                   sync.Mutex
		ok, dup, lost, other int
	)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			token := cur.Token
			if i%2 == 1 {
				token = stale[i%len(stale)]
			}
			<-gate
			_, err := ss.RecordStep(context.Background(), stepReq("race-name", token, "charge", []byte(fmt.Sprint(i))))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
				if token != cur.Token {
					t.Errorf("contract: a stale token (%d) recorded a step", token)
				}
			case errors.Is(err, idem.ErrStepRecorded):
				dup++
			case errors.Is(err, idem.ErrLeaseLost):
				lost++
			default:
				other++
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	open()
	wg.Wait()
	if ok != 1 || lost != writers/2 {
		t.Errorf("contract: %d concurrent writes of one step: exactly 1 succeeds and every stale token gets ErrLeaseLost; got %d ok, %d already recorded, %d lease lost", writers, ok, dup, lost)
	}
	if got := steps(t, ss, "race-name"); len(got) != 1 || got[0].Token != cur.Token {
		t.Errorf("contract: one step recorded by the current token, got %+v", got)
	}
}

// StepTxEnv is one isolated environment for transactional steps
// ([idem.StepTxStore]): a store module adapts its DoStepTx to it. The
// effect of a step is one row, keyed by the step name, inserted in an
// effects table inside the step's transaction.
type StepTxEnv interface {
	// Store is the environment's store; it implements idem.StepStore.
	Store() idem.Store
	// DoStepTx runs the store's DoStepTx for req with a function that
	// inserts the effect row for req.Name and then returns result and
	// fail (nil for success), so a non-nil fail must roll the effect back.
	DoStepTx(ctx context.Context, req idem.StepRequest, result []byte, fail error) (idem.StepRecord, error)
	// Effects returns the number of effect rows per step name.
	Effects(ctx context.Context) (map[string]int, error)
}

// RunStepsTx runs the transactional-steps suite as parallel subtests of
// one subtest named "StepsTx", and returns when all of them have
// finished. newEnv is called once per subtest and must return an isolated
// environment whose effects table is not unique on the name (the suite
// counts double effects).
//
// It checks that effect and step commit together or not at all: a failing
// function, a stale token, a step already recorded and a result over the
// limit all leave no effect; 32 concurrent writes of one step (half with
// stale tokens) leave one effect; and an old holder's transactional steps
// racing a takeover either commit before the claim (the new holder reads
// them) or roll back.
func RunStepsTx(t *testing.T, newEnv func(t *testing.T) StepTxEnv) {
	t.Helper()
	tests := []struct {
		name string
		run  func(t *testing.T, env StepTxEnv)
	}{
		{"CommitTogether", testStepTxCommit},
		{"RollbackTogether", testStepTxRollback},
		{"RaceSameName", testStepTxRaceSameName},
		{"RaceTakeover", testStepTxRaceTakeover},
	}
	t.Run("StepsTx", func(t *testing.T) {
		for _, st := range tests {
			t.Run(st.name, func(t *testing.T) {
				t.Parallel()
				st.run(t, newEnv(t))
			})
		}
	})
}

func stepEffects(t *testing.T, env StepTxEnv) map[string]int {
	t.Helper()
	got, err := env.Effects(context.Background())
	if err != nil {
		t.Fatalf("Effects: %v", err)
	}
	return got
}

func testStepTxCommit(t *testing.T, env StepTxEnv) {
	s := env.Store()
	ss := s.(idem.StepStore)
	cl := acquire(t, s, claimReq("tx", fp("tx"), longLease))
	rec, err := env.DoStepTx(context.Background(), stepReq("tx", cl.Token, "create-ride", nil), []byte("ride_1"), nil)
	if err != nil {
		t.Fatalf("DoStepTx by the current holder: %v", err)
	}
	if rec.Name != "create-ride" || rec.Seq != 1 || string(rec.Result) != "ride_1" || rec.Token != cl.Token {
		t.Errorf("contract: DoStepTx returns the step it recorded, got %+v", rec)
	}
	if got := steps(t, ss, "tx"); len(got) != 1 || string(got[0].Result) != "ride_1" {
		t.Errorf("contract: a committed transactional step is recorded with fn's result, got %+v", got)
	}
	if got := stepEffects(t, env); got["create-ride"] != 1 {
		t.Errorf("contract: a committed transactional step has its effect once, got %v", got)
	}
}

func testStepTxRollback(t *testing.T, env StepTxEnv) {
	ctx := context.Background()
	s := env.Store()
	ss := s.(idem.StepStore)
	cl := acquire(t, s, claimReq("tx", fp("tx"), longLease))
	boom := errors.New("card declined")
	_, err := env.DoStepTx(ctx, stepReq("tx", cl.Token, "failing", nil), nil, boom)
	wantErr(t, err, boom, "DoStepTx returns fn's error wrapped")
	_, err = env.DoStepTx(ctx, stepReq("tx", cl.Token, "too-big", nil), make([]byte, idem.MaxStepResultBytes+1), nil)
	wantErr(t, err, idem.ErrInvalidStep, "DoStepTx with a result over MaxStepResultBytes")
	if _, err := env.DoStepTx(ctx, stepReq("tx", cl.Token, "done", nil), []byte("1"), nil); err != nil {
		t.Fatal(err)
	}
	_, err = env.DoStepTx(ctx, stepReq("tx", cl.Token, "done", nil), []byte("2"), nil)
	wantErr(t, err, idem.ErrStepRecorded, "DoStepTx of a step already recorded")
	if err := s.Release(ctx, scope, "tx", cl.Token); err != nil {
		t.Fatal(err)
	}
	_, err = env.DoStepTx(ctx, stepReq("tx", cl.Token, "stale", nil), nil, nil)
	wantErr(t, err, idem.ErrLeaseLost, "DoStepTx with a released token")
	_, err = env.DoStepTx(ctx, stepReq("tx", cl.Token, "x y", nil), nil, nil)
	wantErr(t, err, idem.ErrInvalidStep, "DoStepTx with an invalid name")
	if got := stepEffects(t, env); len(got) != 1 || got["done"] != 1 {
		t.Errorf("contract: every refused or failed transactional step rolls its effect back, effects %v (want only done: 1)", got)
	}
	if got := steps(t, ss, "tx"); stepNames(got) != "done" || string(got[0].Result) != "1" {
		t.Errorf("contract: only the committed step is recorded, got %q", stepNames(got))
	}
}

func testStepTxRaceSameName(t *testing.T, env StepTxEnv) {
	const writers = 32
	s := env.Store()
	f := fp("tx-race")
	c := acquire(t, s, claimReq("tx-race", f, longLease))
	if err := s.Release(context.Background(), scope, "tx-race", c.Token); err != nil {
		t.Fatal(err)
	}
	stale := c.Token
	cur := acquire(t, s, claimReq("tx-race", f, longLease))
	gate, open := start()
	var (
		wg            sync.WaitGroup
		mu            sync.Mutex
		ok, dup, lost int
	)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			token := cur.Token
			if i%2 == 1 {
				token = stale
			}
			<-gate
			_, err := env.DoStepTx(context.Background(), stepReq("tx-race", token, "pay", nil), []byte(fmt.Sprint(i)), nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, idem.ErrStepRecorded):
				dup++
			case errors.Is(err, idem.ErrLeaseLost):
				lost++
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	open()
	wg.Wait()
	if ok != 1 || lost != writers/2 {
		t.Errorf("contract: %d concurrent transactional writes of one step: exactly 1 commits, every stale token gets ErrLeaseLost; got %d ok, %d already recorded, %d lease lost", writers, ok, dup, lost)
	}
	if got := stepEffects(t, env); got["pay"] != 1 {
		t.Errorf("contract: one effect for one step, got %d", got["pay"])
	}
}

func testStepTxRaceTakeover(t *testing.T, env StepTxEnv) {
	s := env.Store()
	written := raceTakeover(t, s, s.(idem.StepStore), "tx-takeover", 8, 4, 8, func(key string, token int64, name string) error {
		_, err := env.DoStepTx(context.Background(), stepReq(key, token, name, nil), nil, nil)
		return err
	})
	total := 0
	for _, n := range stepEffects(t, env) {
		total += n
	}
	if total != len(written) {
		t.Errorf("contract: effects commit exactly with their steps: %d steps committed, %d effects", len(written), total)
	}
	t.Logf("%d transactional steps of the old holder committed before the takeover", len(written))
}
