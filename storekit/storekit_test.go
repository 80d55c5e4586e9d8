package storekit_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

var (
	fpA = idem.FingerprintBytes([]byte("a"))
	fpB = idem.FingerprintBytes([]byte("b"))
)

func msg(key string, fp idem.Fingerprint) idem.Message {
	return idem.Message{Scope: "s", Key: key, Fingerprint: fp}
}

func TestJudge(t *testing.T) {
	done, prog := idem.StateCompleted, idem.StateInProgress
	for _, c := range []struct {
		name  string
		e     storekit.Existing
		out   idem.Outcome
		retry bool
		err   error
	}{
		{"completed, expired, other content", storekit.Existing{State: done, Fingerprint: fpB, Expired: true}, "", true, nil},
		{"completed", storekit.Existing{State: done, Fingerprint: fpA}, idem.Duplicate, false, nil},
		{"completed, other content", storekit.Existing{State: done, Fingerprint: fpB}, idem.Mismatch, false, idem.ErrFingerprintMismatch},
		{"held", storekit.Existing{State: prog, Fingerprint: fpA, Live: true}, "", false, idem.ErrInProgress},
		{"held, other content", storekit.Existing{State: prog, Fingerprint: fpB, Live: true}, idem.Mismatch, false, idem.ErrFingerprintMismatch},
		{"lease expired", storekit.Existing{State: prog, Fingerprint: fpA}, "", true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, retry, err := storekit.Judge(c.e, msg("k", fpA))
			if out != c.out || retry != c.retry || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
				t.Fatalf("Judge = %q, %v, %v; want %q, %v, %v", out, retry, err, c.out, c.retry, c.err)
			}
		})
	}
}

func TestJudgeClaim(t *testing.T) {
	for claim, want := range map[idem.Outcome]struct {
		out idem.Outcome
		err error
	}{
		idem.Acquired:   {idem.Processed, nil},
		idem.Completed:  {idem.Duplicate, nil},
		idem.Mismatch:   {idem.Mismatch, idem.ErrFingerprintMismatch},
		idem.InProgress: {"", idem.ErrInProgress},
	} {
		out, err := storekit.JudgeClaim(claim, msg("k", fpA))
		if out != want.out || !errors.Is(err, want.err) || (want.err == nil) != (err == nil) {
			t.Errorf("JudgeClaim(%s) = %q, %v; want %q, %v", claim, out, err, want.out, want.err)
		}
	}
	if out, err := storekit.JudgeClaim("bogus", msg("k", fpA)); out != "" || err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("unknown claim outcome = %q, %v", out, err)
	}
}

func TestValidateBatch(t *testing.T) {
	ok := []idem.Message{msg("a", fpA), msg("b", fpA)}
	if err := storekit.ValidateBatch(ok, 2, idem.Message.Validate); err != nil {
		t.Fatalf("valid batch: %v", err)
	}
	if err := storekit.ValidateBatch(ok, 1, idem.Message.Validate); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Fatalf("over the limit: %v, want ErrInvalidConfig", err)
	}
	bad := []idem.Message{msg("a", fpA), msg("", fpA)}
	if err := storekit.ValidateBatch(bad, 10, idem.Message.Validate); !errors.Is(err, idem.ErrInvalidKey) || !strings.Contains(err.Error(), "request 1") {
		t.Fatalf("invalid key: %v, want ErrInvalidKey naming request 1", err)
	}
}

func TestFirsts(t *testing.T) {
	msgs := []idem.Message{msg("a", fpA), msg("b", fpA), msg("a", fpB), {Scope: "t", Key: "a"}, msg("b", fpA)}
	if got, want := storekit.Firsts(msgs), []int{0, 1, 0, 3, 1}; !slices.Equal(got, want) {
		t.Fatalf("Firsts = %v, want %v", got, want)
	}
}

func TestSettleRepeats(t *testing.T) {
	msgs := []idem.Message{
		msg("new", fpA),   // 0 processed
		msg("done", fpA),  // 1 duplicate
		msg("other", fpB), // 2 mismatch: stored holds fpA
		msg("new", fpA),   // 3 repeat: duplicate
		msg("new", fpB),   // 4 repeat, other content: mismatch
		msg("done", fpA),  // 5 duplicate
		msg("other", fpA), // 6 matches what is stored: duplicate
		msg("other", fpB), // 7 mismatch
	}
	first := storekit.Firsts(msgs)
	settled := func() []idem.Outcome {
		r := make([]idem.Outcome, len(msgs))
		r[0], r[1], r[2] = idem.Processed, idem.Duplicate, idem.Mismatch
		return r
	}
	stored := map[int]storekit.Existing{
		1: {State: idem.StateCompleted, Fingerprint: fpA},
		2: {State: idem.StateCompleted, Fingerprint: fpA},
	}
	results := settled()
	if err := storekit.SettleRepeats(msgs, first, results, func(j int) (storekit.Existing, bool) {
		e, ok := stored[j]
		return e, ok
	}); err != nil {
		t.Fatal(err)
	}
	want := []idem.Outcome{idem.Processed, idem.Duplicate, idem.Mismatch, idem.Duplicate, idem.Mismatch, idem.Duplicate, idem.Duplicate, idem.Mismatch}
	if !slices.Equal(results, want) {
		t.Fatalf("with records: %v, want %v", results, want)
	}

	// Without the records, a repeat of a mismatch is a mismatch.
	results = settled()
	if err := storekit.SettleRepeats(msgs, first, results, nil); err != nil {
		t.Fatal(err)
	}
	want[6] = idem.Mismatch
	if !slices.Equal(results, want) {
		t.Fatalf("without records: %v, want %v", results, want)
	}

	// A repeat that matches a record a Guard holds fails the batch.
	stored[2] = storekit.Existing{State: idem.StateInProgress, Fingerprint: fpA}
	err := storekit.SettleRepeats(msgs, first, settled(), func(j int) (storekit.Existing, bool) {
		e, ok := stored[j]
		return e, ok
	})
	if !errors.Is(err, idem.ErrInProgress) || !strings.Contains(err.Error(), "message 6") {
		t.Fatalf("held record: %v, want ErrInProgress naming message 6", err)
	}
}
