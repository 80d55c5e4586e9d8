package storekit_test

import (
	"errors"
	"strings"
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

func TestStepResult(t *testing.T) {
	req := idem.StepRequest{Scope: "s", Key: "k", Name: "charge"}
	boom := errors.New("declined")
	if _, err := storekit.StepResult("store", req, nil, boom); !errors.Is(err, boom) || !strings.Contains(err.Error(), `store: step "charge"`) {
		t.Errorf("fn's error: want it wrapped and named, got %v", err)
	}
	if _, err := storekit.StepResult("store", req, make([]byte, idem.MaxStepResultBytes+1), nil); !errors.Is(err, idem.ErrInvalidStep) {
		t.Errorf("a result over the limit: want ErrInvalidStep, got %v", err)
	}
	if got, err := storekit.StepResult("store", req, []byte("ok"), nil); err != nil || string(got.Result) != "ok" {
		t.Errorf("a result: got %q, %v", got.Result, err)
	}
}
