package storekit

import (
	"fmt"

	"github.com/idem-go/idem"
)

// Existing is the record a store found under a message's (scope, key)
// when its insert of the dedupe record did not go through.
type Existing struct {
	State       idem.State
	Fingerprint idem.Fingerprint
	// Live: an in-progress record whose lease has not expired.
	Live bool
	// Expired: a completed record past its retention (it counts as absent).
	Expired bool
}

// Judge says what an existing record means for msg on the transactional
// path:
//
//   - retry: the record counts as absent (a completed record past its
//     window, or an in-progress one whose lease expired, with msg's
//     fingerprint): run the insert again, which takes it over;
//   - Mismatch and an error wrapping idem.ErrFingerprintMismatch: the key
//     holds other content; nothing may be recorded for msg;
//   - Duplicate: msg was processed before; skip it;
//   - an error wrapping idem.ErrInProgress: a Guard holds a live lease.
func Judge(e Existing, msg idem.Message) (out idem.Outcome, retry bool, err error) {
	switch {
	case e.State == idem.StateCompleted && e.Expired:
		return "", true, nil
	case e.Fingerprint != msg.Fingerprint:
		return idem.Mismatch, false, fmt.Errorf("%w (scope %q, key %q)", idem.ErrFingerprintMismatch, msg.Scope, msg.Key)
	case e.State == idem.StateCompleted:
		return idem.Duplicate, false, nil
	case e.Live:
		return "", false, fmt.Errorf("%w (scope %q, key %q): a lease holder is running it", idem.ErrInProgress, msg.Scope, msg.Key)
	}
	return "", true, nil
}

// JudgeClaim is [Judge] for a store that answers the transactional path
// with lease-path claims (Redis): the claim's outcome on msg's key becomes
// Processed (Acquired: run the work), Duplicate (Completed), Mismatch (with
// an error wrapping idem.ErrFingerprintMismatch), or an error wrapping
// idem.ErrInProgress.
func JudgeClaim(claim idem.Outcome, msg idem.Message) (idem.Outcome, error) {
	switch claim {
	case idem.Acquired:
		return idem.Processed, nil
	case idem.Completed:
		return idem.Duplicate, nil
	case idem.Mismatch:
		return idem.Mismatch, fmt.Errorf("%w (scope %q, key %q)", idem.ErrFingerprintMismatch, msg.Scope, msg.Key)
	case idem.InProgress:
		return "", fmt.Errorf("%w (scope %q, key %q)", idem.ErrInProgress, msg.Scope, msg.Key)
	}
	return "", fmt.Errorf("unknown claim outcome %q (scope %q, key %q)", claim, msg.Scope, msg.Key)
}
