package storekit

import (
	"fmt"

	"github.com/idem-go/idem"
)

// StepStats is what a store reads of an operation's live steps, in the
// transaction that records one more, after it dropped the expired ones.
type StepStats struct {
	// Count is how many steps the operation has and MaxSeq the highest Seq.
	Count, MaxSeq int
	// Recorded says the step being written is among them.
	Recorded bool
	// OtherPayload says some of them carry another fingerprint than the
	// record's: the key was released and reused with another request.
	OtherPayload bool
}

// NewStep judges whether req may be recorded for an operation whose live
// steps are st, and returns the step to write: Seq MaxSeq+1, the record's
// fingerprint fp, req's token, and its result (an empty one, not nil,
// unless it is a tombstone). The store sets CreatedAt and ExpiresAt by its
// own clock. The errors are those of [idem.StepStore.RecordStep], in this
// order: another payload's steps, a step already recorded, too many steps.
func NewStep(req idem.StepRequest, fp []byte, st StepStats) (idem.StepRecord, error) {
	switch {
	case st.OtherPayload:
		return idem.StepRecord{}, idem.StepsOfOtherPayload(req.Scope, req.Key)
	case st.Recorded:
		return idem.StepRecord{}, idem.StepAlreadyRecorded(req.Scope, req.Key, req.Name)
	case st.Count >= idem.MaxSteps:
		return idem.StepRecord{}, idem.TooManySteps(req.Scope, req.Key, req.Name)
	}
	rec := idem.StepRecord{Scope: req.Scope, Key: req.Key, Name: req.Name, Seq: st.MaxSeq + 1, Token: req.Token, Tombstone: req.Tombstone}
	copy(rec.Fingerprint[:], fp)
	if !req.Tombstone {
		rec.Result = req.Result
		if rec.Result == nil {
			rec.Result = []byte{}
		}
	}
	return rec, nil
}

// StepResult takes what the function of a transactional step returned
// (idem.StepTxStore.DoStepTx) and gives req with its result to record, or
// the error to roll the transaction back with: fn's error wrapped (named
// by store, e.g. "idempgx"), or an error wrapping idem.ErrInvalidStep for a
// result over idem.MaxStepResultBytes.
func StepResult(store string, req idem.StepRequest, val []byte, err error) (idem.StepRequest, error) {
	if err != nil {
		return req, fmt.Errorf("%s: step %q (scope %q, key %q): %w", store, req.Name, req.Scope, req.Key, err)
	}
	if len(val) > idem.MaxStepResultBytes {
		return req, idem.StepResultTooLarge(req.Name, len(val))
	}
	req.Result = val
	return req, nil
}
