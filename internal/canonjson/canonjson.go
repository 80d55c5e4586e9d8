// Package canonjson writes a canonical form of a JSON document, so that two
// documents that differ only in object member order or insignificant white
// space have the same bytes.
//
// Object members are sorted by their (decoded) names, compared as UTF-16 code
// units as in RFC 8785. Strings are decoded and re-encoded in one fixed way,
// so "\u0041" and "A" are the same. Numbers keep their literal text: 1 and
// 1.0 stay different, because normalising through float64 would make two
// different large integers (IDs, amounts in minor units) collide. Duplicate
// member names, invalid UTF-8 and lone surrogate escapes are rejected: their
// meaning differs between parsers, so they cannot have one canonical form.
//
// The scanner is hand-written because it sits on the replay path of every
// HTTP request: it makes one pass, allocates the output and little else.
package canonjson

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds nesting so that a hostile document cannot exhaust the stack.
const MaxDepth = 512

// Canonicalize returns the canonical form of the JSON document in data.
func Canonicalize(data []byte) ([]byte, error) {
	s := scanner{in: data, out: make([]byte, 0, len(data))}
	s.skipSpace()
	if s.pos == len(s.in) {
		return nil, errors.New("canonjson: empty document")
	}
	if err := s.value(0); err != nil {
		return nil, err
	}
	s.skipSpace()
	if s.pos != len(s.in) {
		return nil, s.errorf("trailing data after the JSON value")
	}
	return s.out, nil
}

type scanner struct {
	in  []byte
	pos int
	out []byte
	// spans and scratch are reused by every object to sort its members.
	spans   []span
	scratch []byte
}

// span is one object member in out: the canonical "name":value bytes and
// where its decoded name lies.
type span struct {
	start, nameEnd, end int
}

func (s *scanner) errorf(format string, args ...any) error {
	return fmt.Errorf("canonjson: offset %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.in) {
		switch s.in[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) value(depth int) error {
	if s.pos >= len(s.in) {
		return s.errorf("unexpected end of document")
	}
	switch c := s.in[s.pos]; {
	case c == '{':
		return s.object(depth + 1)
	case c == '[':
		return s.array(depth + 1)
	case c == '"':
		return s.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	default:
		return s.errorf("invalid character %q looking for a value", c)
	}
}

func (s *scanner) literal(word string) error {
	if !bytes.HasPrefix(s.in[s.pos:], []byte(word)) {
		return s.errorf("invalid literal, want %s", word)
	}
	s.pos += len(word)
	s.out = append(s.out, word...)
	return nil
}

// number validates the JSON number grammar and copies the literal text.
func (s *scanner) number() error {
	start := s.pos
	in := s.in
	i := s.pos
	if in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && in[i] >= '1' && in[i] <= '9':
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	default:
		s.pos = i
		return s.errorf("invalid number")
	}
	if i < len(in) && in[i] == '.' {
		i++
		if i >= len(in) || !isDigit(in[i]) {
			s.pos = i
			return s.errorf("invalid number: no digits after the decimal point")
		}
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		if i >= len(in) || !isDigit(in[i]) {
			s.pos = i
			return s.errorf("invalid number: no digits in the exponent")
		}
		for i < len(in) && isDigit(in[i]) {
			i++
		}
	}
	s.pos = i
	s.out = append(s.out, in[start:i]...)
	return nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func (s *scanner) array(depth int) error {
	if depth > MaxDepth {
		return s.errorf("nesting deeper than %d", MaxDepth)
	}
	s.pos++ // [
	s.out = append(s.out, '[')
	s.skipSpace()
	if s.pos < len(s.in) && s.in[s.pos] == ']' {
		s.pos++
		s.out = append(s.out, ']')
		return nil
	}
	for {
		s.skipSpace()
		if err := s.value(depth); err != nil {
			return err
		}
		s.skipSpace()
		if s.pos >= len(s.in) {
			return s.errorf("unexpected end of array")
		}
		switch s.in[s.pos] {
		case ',':
			s.pos++
			s.out = append(s.out, ',')
		case ']':
			s.pos++
			s.out = append(s.out, ']')
			return nil
		default:
			return s.errorf("invalid character %q after an array element", s.in[s.pos])
		}
	}
}

func (s *scanner) object(depth int) error {
	if depth > MaxDepth {
		return s.errorf("nesting deeper than %d", MaxDepth)
	}
	s.pos++ // {
	s.out = append(s.out, '{')
	s.skipSpace()
	if s.pos < len(s.in) && s.in[s.pos] == '}' {
		s.pos++
		s.out = append(s.out, '}')
		return nil
	}
	// Members are written to out in document order, then rearranged in
	// place. Nested objects push their own spans above ours.
	base := len(s.spans)
	region := len(s.out)
	for {
		s.skipSpace()
		if s.pos >= len(s.in) || s.in[s.pos] != '"' {
			return s.errorf("object member name must be a string")
		}
		start := len(s.out)
		if err := s.str(); err != nil {
			return err
		}
		nameEnd := len(s.out)
		s.skipSpace()
		if s.pos >= len(s.in) || s.in[s.pos] != ':' {
			return s.errorf("missing ':' after object member name")
		}
		s.pos++
		s.out = append(s.out, ':')
		s.skipSpace()
		if err := s.value(depth); err != nil {
			return err
		}
		s.spans = append(s.spans, span{start: start, nameEnd: nameEnd, end: len(s.out)})
		s.skipSpace()
		if s.pos >= len(s.in) {
			return s.errorf("unexpected end of object")
		}
		if s.in[s.pos] == ',' {
			s.pos++
			continue
		}
		if s.in[s.pos] == '}' {
			s.pos++
			break
		}
		return s.errorf("invalid character %q after an object member", s.in[s.pos])
	}
	members := s.spans[base:]
	out := s.out
	// Names are compared in their canonical (encoded) form: the encoding is
	// one-to-one and order-preserving except for the escapes of control
	// characters, quote and backslash, so compare decoded names only when
	// one of those is present.
	name := func(m span) []byte { return out[m.start+1 : m.nameEnd-1] }
	slices.SortStableFunc(members, func(a, b span) int { return compareNames(name(a), name(b)) })
	for i := 1; i < len(members); i++ {
		if compareNames(name(members[i-1]), name(members[i])) == 0 {
			return s.errorf("duplicate object member %s", out[members[i].start:members[i].nameEnd])
		}
	}
	s.scratch = s.scratch[:0]
	for i, m := range members {
		if i > 0 {
			s.scratch = append(s.scratch, ',')
		}
		s.scratch = append(s.scratch, out[m.start:m.end]...)
	}
	s.out = append(s.out[:region], s.scratch...)
	s.out = append(s.out, '}')
	s.spans = s.spans[:base]
	return nil
}

// compareNames orders two encoded member names (without their quotes) by
// the UTF-16 code units of their decoded values (RFC 8785 §3.2.3).
func compareNames(a, b []byte) int {
	if simple(a) && simple(b) {
		// Without escapes or 4-byte sequences, UTF-8 byte order is UTF-16
		// code unit order.
		return bytes.Compare(a, b)
	}
	return slices.Compare(utf16.Encode([]rune(decodeName(a))), utf16.Encode([]rune(decodeName(b))))
}

func simple(b []byte) bool {
	for _, c := range b {
		if c == '\\' || c >= 0xf0 {
			return false
		}
	}
	return true
}

// decodeName undoes the canonical escaping written by str.
func decodeName(b []byte) string {
	if bytes.IndexByte(b, '\\') < 0 {
		return string(b)
	}
	var d []byte
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			d = append(d, b[i])
			continue
		}
		i++
		switch b[i] {
		case 'b':
			d = append(d, '\b')
		case 'f':
			d = append(d, '\f')
		case 'n':
			d = append(d, '\n')
		case 'r':
			d = append(d, '\r')
		case 't':
			d = append(d, '\t')
		case 'u': // \u00XX, a control character
			d = append(d, unhex(b[i+3])<<4|unhex(b[i+4]))
			i += 4
		default: // \" and \\
			d = append(d, b[i])
		}
	}
	return string(d)
}

const hexDigits = "0123456789abcdef"

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 0xff
}

// str decodes the string at pos and writes it with the minimal escaping of
// RFC 8785: \" and \\, short forms for control characters that have them,
// \u00XX for the others, everything else as UTF-8.
func (s *scanner) str() error {
	s.pos++ // opening quote
	s.out = append(s.out, '"')
	in := s.in
	for s.pos < len(in) {
		c := in[s.pos]
		switch {
		case c == '"':
			s.pos++
			s.out = append(s.out, '"')
			return nil
		case c == '\\':
			r, err := s.escape()
			if err != nil {
				return err
			}
			s.appendRune(r)
		case c < 0x20:
			return s.errorf("control character 0x%02x in a string", c)
		case c < utf8.RuneSelf:
			s.pos++
			s.out = append(s.out, c)
		default:
			r, n := utf8.DecodeRune(in[s.pos:])
			if r == utf8.RuneError && n <= 1 {
				return s.errorf("invalid UTF-8 in a string")
			}
			s.out = append(s.out, in[s.pos:s.pos+n]...)
			s.pos += n
		}
	}
	return s.errorf("unterminated string")
}

// escape decodes the escape sequence at pos, joining surrogate pairs.
func (s *scanner) escape() (rune, error) {
	in := s.in
	if s.pos+1 >= len(in) {
		return 0, s.errorf("unterminated escape")
	}
	c := in[s.pos+1]
	s.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
		r, ok := s.hex4()
		if !ok {
			return 0, s.errorf("invalid \\u escape")
		}
		if !utf16.IsSurrogate(r) {
			return r, nil
		}
		if r < 0xdc00 && s.pos+1 < len(in) && in[s.pos] == '\\' && in[s.pos+1] == 'u' {
			s.pos += 2
			if lo, ok := s.hex4(); ok && lo >= 0xdc00 && lo <= 0xdfff {
				return utf16.DecodeRune(r, lo), nil
			}
		}
		return 0, s.errorf("lone UTF-16 surrogate in a \\u escape")
	}
	return 0, s.errorf("invalid escape \\%c", c)
}

func (s *scanner) hex4() (rune, bool) {
	if s.pos+4 > len(s.in) {
		return 0, false
	}
	var r rune
	for _, c := range s.in[s.pos : s.pos+4] {
		v := unhex(c)
		if v == 0xff {
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	s.pos += 4
	return r, true
}

func (s *scanner) appendRune(r rune) {
	switch r {
	case '"':
		s.out = append(s.out, '\\', '"')
	case '\\':
		s.out = append(s.out, '\\', '\\')
	case '\b':
		s.out = append(s.out, '\\', 'b')
	case '\f':
		s.out = append(s.out, '\\', 'f')
	case '\n':
		s.out = append(s.out, '\\', 'n')
	case '\r':
		s.out = append(s.out, '\\', 'r')
	case '\t':
		s.out = append(s.out, '\\', 't')
	default:
		if r < 0x20 {
			s.out = append(s.out, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
			return
		}
		s.out = utf8.AppendRune(s.out, r)
	}
}
