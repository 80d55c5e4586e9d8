package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

const (
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 255
	// MaxScopeLen is the longest scope accepted, in bytes.
	MaxScopeLen = 1024
)

// ValidateKey reports whether key is 1–[MaxKeyLen] bytes of printable ASCII
// (0x20–0x7E, the characters an RFC 8941 sf-string may carry). Any other key
// gets an error wrapping [ErrInvalidKey] that says what is wrong.
func ValidateKey(key string) error {
	if len(key) == 0 {
		return fmt.Errorf("%w: key is empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte 0x%02x at offset %d is not printable ASCII", ErrInvalidKey, c, i)
		}
	}
	return nil
}

// ValidateScope reports whether scope is valid UTF-8 of at most
// [MaxScopeLen] bytes. The empty scope is valid: it is one shared namespace.
func ValidateScope(scope string) error {
	if len(scope) > MaxScopeLen {
		return fmt.Errorf("%w: scope is %d bytes, the limit is %d", ErrInvalidScope, len(scope), MaxScopeLen)
	}
	if !utf8.ValidString(scope) {
		return fmt.Errorf("%w: scope is not valid UTF-8", ErrInvalidScope)
	}
	return nil
}

// Validate checks scope and key together, key first.
func Validate(scope, key string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateScope(scope)
}

// ContentID returns the content-based id of a message body: the lowercase
// hex SHA-256 of body, a valid key. Two publishes of the same bytes get the
// same id, so a producer's blind retry is deduplicated; a change to any byte
// makes a new message. Every broker adapter uses it for messages that
// arrive without an id (when content keys are on) and for its publishers.
func ContentID(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}
