package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"github.com/idem-go/idem/internal/canonjson"
)

// Fingerprint is the SHA-256 digest of a request's or message's content. A
// record remembers the fingerprint of the call that created it; a later call
// with the same (scope, key) and a different fingerprint is a mismatch.
//
// The zero Fingerprint is a valid value meaning "no content": two calls that
// both carry no fingerprint match each other.
type Fingerprint [sha256.Size]byte

// String returns the fingerprint in lowercase hex.
func (f Fingerprint) String() string { return hex.EncodeToString(f[:]) }

// IsZero reports whether f is the zero fingerprint.
func (f Fingerprint) IsZero() bool { return f == Fingerprint{} }

// ParseFingerprint parses the hex form written by [Fingerprint.String].
func ParseFingerprint(s string) (Fingerprint, error) {
	var f Fingerprint
	if len(s) != 2*len(f) {
		return f, fmt.Errorf("idem: fingerprint must be %d hex digits, got %d", 2*len(f), len(s))
	}
	if _, err := hex.Decode(f[:], []byte(s)); err != nil {
		return f, fmt.Errorf("idem: fingerprint: %w", err)
	}
	return f, nil
}

// FingerprintBytes returns the SHA-256 of data, exactly as given.
func FingerprintBytes(data []byte) Fingerprint { return sha256.Sum256(data) }

// FingerprintParts hashes several fields so that field boundaries count:
// each part is length-prefixed, so ("ab", "c") and ("a", "bc") differ.
func FingerprintParts(parts ...[]byte) Fingerprint {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	var f Fingerprint
	h.Sum(f[:0])
	return f
}

// FingerprintJSON returns the SHA-256 of the canonical form of a JSON
// document: object member order and white space do not change it; numbers
// (by their literal text), strings, array order and null-versus-missing do.
// Invalid JSON and duplicate member names are errors.
func FingerprintJSON(data []byte) (Fingerprint, error) {
	c, err := CanonicalJSON(data)
	if err != nil {
		return Fingerprint{}, err
	}
	return sha256.Sum256(c), nil
}

// CanonicalJSON returns the canonical form of a JSON document that
// [FingerprintJSON] hashes: members sorted by name, no insignificant white
// space, strings in one fixed escaping, numbers as written.
func CanonicalJSON(data []byte) ([]byte, error) {
	c, err := canonjson.Canonicalize(data)
	if err != nil {
		return nil, fmt.Errorf("idem: %w", err)
	}
	return c, nil
}
