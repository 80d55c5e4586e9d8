package storekit_test

import (
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

func TestNewStep(t *testing.T) {
	fp := idem.FingerprintBytes([]byte("payload"))
	req := idem.StepRequest{Scope: "s", Key: "k", Token: 7, Name: "charge", Retention: 1}
	rec, err := storekit.NewStep(req, fp[:], storekit.StepStats{Count: 2, MaxSeq: 5})
	if err != nil || rec.Seq != 6 || rec.Token != 7 || rec.Fingerprint != fp || rec.Result == nil || rec.Name != "charge" {
		t.Fatalf("NewStep: %+v, %v", rec, err)
	}
	req.Tombstone = true
	if rec, _ := storekit.NewStep(req, fp[:], storekit.StepStats{}); rec.Result != nil || !rec.Tombstone || rec.Seq != 1 {
		t.Errorf("a tombstone has no result: %+v", rec)
	}
	for _, c := range []struct {
		st   storekit.StepStats
		want error
	}{
		{storekit.StepStats{OtherPayload: true, Recorded: true}, idem.ErrFingerprintMismatch},
		{storekit.StepStats{Recorded: true, Count: idem.MaxSteps}, idem.ErrStepRecorded},
		{storekit.StepStats{Count: idem.MaxSteps}, idem.ErrInvalidStep},
	} {
		if _, err := storekit.NewStep(req, fp[:], c.st); !errors.Is(err, c.want) {
			t.Errorf("%+v: want %v, got %v", c.st, c.want, err)
		}
	}
}
