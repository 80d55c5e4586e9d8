package idemhttp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// A stored response is encoded in a small versioned binary format:
//
//	"IH" version(1) flags(1) status(u16) headerCount(u16)
//	headerCount × { nameLen(u16) name valueLen(u16) value }
//	bodyLen(u32) body
//
// All integers are big-endian. Flag bit 0 marks a discarded response: the
// handler completed but its response exceeded the capture limit, so only
// the fact of completion is kept. Flag bit 1 (with bit 0) marks a protocol
// switch: the handler took the connection over, and there is nothing to
// replay. The format is versioned so that a later
// release can still replay what an earlier one stored.
const (
	formatVersion  = 1
	flagDiscarded  = 1 << 0
	flagUpgraded   = 1 << 1
	maxStoredField = 1<<16 - 1

	// MaxStoredHeaders bounds how many header lines are stored per response.
	MaxStoredHeaders = 64
	// MaxStoredHeaderBytes bounds the total size of stored header names and values.
	MaxStoredHeaderBytes = 16 << 10
)

var errCorrupt = errors.New("idemhttp: stored response is corrupt")

// storedResponse is a response as kept in the store.
type storedResponse struct {
	status    int
	header    http.Header
	body      []byte
	discarded bool
	upgraded  bool
	// lines is the header as the replay writes it, set when the response
	// is cached (before any other goroutine can see it) and then never
	// changed; nil otherwise.
	lines *replayLines
}

func (s *storedResponse) encode() []byte {
	n := 2 + 1 + 1 + 2 + 2 + 4 + len(s.body)
	count := 0
	for k, vs := range s.header {
		count += len(vs)
		for _, v := range vs {
			n += 4 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, 'I', 'H', formatVersion, 0)
	if s.discarded {
		b[3] |= flagDiscarded
	}
	if s.upgraded {
		b[3] |= flagDiscarded | flagUpgraded
	}
	b = binary.BigEndian.AppendUint16(b, uint16(s.status))
	b = binary.BigEndian.AppendUint16(b, uint16(count))
	for k, vs := range s.header {
		for _, v := range vs {
			b = binary.BigEndian.AppendUint16(b, uint16(len(k)))
			b = append(b, k...)
			b = binary.BigEndian.AppendUint16(b, uint16(len(v)))
			b = append(b, v...)
		}
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.body)))
	return append(b, s.body...)
}

func decodeResponse(b []byte) (*storedResponse, error) {
	if len(b) < 10 || b[0] != 'I' || b[1] != 'H' {
		return nil, fmt.Errorf("%w: bad magic", errCorrupt)
	}
	if b[2] != formatVersion {
		return nil, fmt.Errorf("%w: unknown format version %d", errCorrupt, b[2])
	}
	s := &storedResponse{discarded: b[3]&flagDiscarded != 0, upgraded: b[3]&flagUpgraded != 0, header: http.Header{}}
	s.status = int(binary.BigEndian.Uint16(b[4:]))
	if s.status < 100 || s.status > 999 {
		return nil, fmt.Errorf("%w: status %d", errCorrupt, s.status)
	}
	count := int(binary.BigEndian.Uint16(b[6:]))
	if count > MaxStoredHeaders {
		return nil, fmt.Errorf("%w: %d headers", errCorrupt, count)
	}
	b = b[8:]
	field := func() (string, bool) {
		if len(b) < 2 {
			return "", false
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return "", false
		}
		f := string(b[2 : 2+n])
		b = b[2+n:]
		return f, true
	}
	for range count {
		k, ok1 := field()
		v, ok2 := field()
		if !ok1 || !ok2 || !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") {
			return nil, fmt.Errorf("%w: bad header", errCorrupt)
		}
		s.header[k] = append(s.header[k], v)
	}
	if len(b) < 4 || uint64(len(b)-4) != uint64(binary.BigEndian.Uint32(b)) {
		return nil, fmt.Errorf("%w: body length", errCorrupt)
	}
	s.body = b[4:]
	return s, nil
}

func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}
