package idemredis

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// TestRecordKeyFormat pins the record key to its layout (prefix, then the
// hex SHA-256 of the length-prefixed scope and key in braces): records
// written by earlier versions must still be found. Long scopes and keys
// take another path through recordKey than short ones.
func TestRecordKeyFormat(t *testing.T) {
	t.Parallel()
	s := &Store{prefix: "idem:"}
	for _, tt := range []struct{ scope, key string }{
		{"payments", "order-1"},
		{"", "k"},
		{strings.Repeat("s", idem.MaxScopeLen), strings.Repeat("k", idem.MaxKeyLen)},
		{strings.Repeat("s", 200), strings.Repeat("k", 40)}, // 256 bytes with the lengths
		{strings.Repeat("s", 200), strings.Repeat("k", 41)},
	} {
		var b []byte
		b = binary.BigEndian.AppendUint64(b, uint64(len(tt.scope)))
		b = append(b, tt.scope...)
		b = binary.BigEndian.AppendUint64(b, uint64(len(tt.key)))
		b = append(b, tt.key...)
		sum := sha256.Sum256(b)
		want := "idem:{" + hex.EncodeToString(sum[:]) + "}"
		if got := s.recordKey(tt.scope, tt.key); got != want {
			t.Errorf("recordKey(%d-byte scope, %d-byte key) = %q, want %q", len(tt.scope), len(tt.key), got, want)
		}
	}
}
