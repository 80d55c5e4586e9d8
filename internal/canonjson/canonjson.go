// Package canonjson writes a canonical form of a JSON document, so that two
// documents that differ only in object member order or insignificant white
// space have the same bytes.
//
// Object members are sorted by their (decoded) names, compared as UTF-16 code
// units as in RFC 8785. Strings are decoded and re-encoded in one fixed way,
// so "\u0041" and "A" are the same. Numbers keep their literal text: 1 and
// 1.0 stay different, because normalising through float64 would make two
// different large integers (IDs, amounts in minor units) collide. Duplicate
// member names are rejected, since their meaning differs between parsers.
package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds nesting so that a hostile document cannot exhaust the stack.
const MaxDepth = 512

// Canonicalize returns the canonical form of the JSON document in data.
func Canonicalize(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(data))
	if err := writeValue(&out, dec, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canonjson: trailing data after the JSON value")
	}
	return out.Bytes(), nil
}

func writeValue(out *bytes.Buffer, dec *json.Decoder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return errors.New("canonjson: empty document")
		}
		return fmt.Errorf("canonjson: %w", err)
	}
	return writeToken(out, dec, tok, depth)
}

func writeToken(out *bytes.Buffer, dec *json.Decoder, tok json.Token, depth int) error {
	switch v := tok.(type) {
	case json.Delim:
		if depth >= MaxDepth {
			return fmt.Errorf("canonjson: nesting deeper than %d", MaxDepth)
		}
		if v == '[' {
			return writeArray(out, dec, depth+1)
		}
		return writeObject(out, dec, depth+1)
	case string:
		writeString(out, v)
	case json.Number:
		out.WriteString(string(v))
	case bool:
		out.WriteString(strconv.FormatBool(v))
	case nil:
		out.WriteString("null")
	default:
		return fmt.Errorf("canonjson: unexpected token %v", tok)
	}
	return nil
}

func writeArray(out *bytes.Buffer, dec *json.Decoder, depth int) error {
	out.WriteByte('[')
	for i := 0; ; i++ {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("canonjson: %w", err)
		}
		if d, ok := tok.(json.Delim); ok && d == ']' {
			out.WriteByte(']')
			return nil
		}
		if i > 0 {
			out.WriteByte(',')
		}
		if err := writeToken(out, dec, tok, depth); err != nil {
			return err
		}
	}
}

type member struct {
	name  string
	value []byte
}

func writeObject(out *bytes.Buffer, dec *json.Decoder, depth int) error {
	var members []member
	for {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("canonjson: %w", err)
		}
		if d, ok := tok.(json.Delim); ok && d == '}' {
			break
		}
		name, ok := tok.(string)
		if !ok {
			return fmt.Errorf("canonjson: object member name is %v, not a string", tok)
		}
		var val bytes.Buffer
		if err := writeValue(&val, dec, depth); err != nil {
			return err
		}
		members = append(members, member{name: name, value: val.Bytes()})
	}
	slices.SortFunc(members, func(a, b member) int { return compareUTF16(a.name, b.name) })
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			if members[i-1].name == m.name {
				return fmt.Errorf("canonjson: duplicate object member %q", m.name)
			}
			out.WriteByte(',')
		}
		writeString(out, m.name)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	return nil
}

// compareUTF16 orders strings by their UTF-16 code units (RFC 8785 §3.2.3).
func compareUTF16(a, b string) int {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	return slices.Compare(ua, ub)
}

const hexDigits = "0123456789abcdef"

// writeString writes s with the minimal escaping of RFC 8785: the two
// mandatory escapes, short forms for control characters, \u00XX for the rest
// of them, everything else as UTF-8.
func writeString(out *bytes.Buffer, s string) {
	out.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			out.WriteString(`\"`)
		case '\\':
			out.WriteString(`\\`)
		case '\b':
			out.WriteString(`\b`)
		case '\f':
			out.WriteString(`\f`)
		case '\n':
			out.WriteString(`\n`)
		case '\r':
			out.WriteString(`\r`)
		case '\t':
			out.WriteString(`\t`)
		default:
			if r < 0x20 {
				out.WriteString(`\u00`)
				out.WriteByte(hexDigits[r>>4])
				out.WriteByte(hexDigits[r&0xf])
				continue
			}
			var buf [utf8.UTFMax]byte
			n := utf8.EncodeRune(buf[:], r)
			out.Write(buf[:n])
		}
	}
	out.WriteByte('"')
}
