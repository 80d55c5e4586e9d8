package canonjson

// This file keeps the first implementation, built on encoding/json's
// tokenizer, as the reference that the fuzz test compares the hand-written
// scanner against.

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

func referenceCanonicalize(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(data))
	if err := refWriteValue(&out, dec, 0); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("canonjson: trailing data after the JSON value")
	}
	return out.Bytes(), nil
}

func refWriteValue(out *bytes.Buffer, dec *json.Decoder, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return errors.New("canonjson: empty document")
		}
		return fmt.Errorf("canonjson: %w", err)
	}
	return refWriteToken(out, dec, tok, depth)
}

func refWriteToken(out *bytes.Buffer, dec *json.Decoder, tok json.Token, depth int) error {
	switch v := tok.(type) {
	case json.Delim:
		if depth >= MaxDepth {
			return fmt.Errorf("canonjson: nesting deeper than %d", MaxDepth)
		}
		if v == '[' {
			return refWriteArray(out, dec, depth+1)
		}
		return refWriteObject(out, dec, depth+1)
	case string:
		refWriteString(out, v)
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

func refWriteArray(out *bytes.Buffer, dec *json.Decoder, depth int) error {
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
		if err := refWriteToken(out, dec, tok, depth); err != nil {
			return err
		}
	}
}

type refMember struct {
	name  string
	value []byte
}

func refWriteObject(out *bytes.Buffer, dec *json.Decoder, depth int) error {
	var refMembers []refMember
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
			return fmt.Errorf("canonjson: object refMember name is %v, not a string", tok)
		}
		var val bytes.Buffer
		if err := refWriteValue(&val, dec, depth); err != nil {
			return err
		}
		refMembers = append(refMembers, refMember{name: name, value: val.Bytes()})
	}
	slices.SortFunc(refMembers, func(a, b refMember) int { return refCompareUTF16(a.name, b.name) })
	out.WriteByte('{')
	for i, m := range refMembers {
		if i > 0 {
			if refMembers[i-1].name == m.name {
				return fmt.Errorf("canonjson: duplicate object refMember %q", m.name)
			}
			out.WriteByte(',')
		}
		refWriteString(out, m.name)
		out.WriteByte(':')
		out.Write(m.value)
	}
	out.WriteByte('}')
	return nil
}

// refCompareUTF16 orders strings by their UTF-16 code units (RFC 8785 §3.2.3).
func refCompareUTF16(a, b string) int {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	return slices.Compare(ua, ub)
}

const refHexDigits = "0123456789abcdef"

// refWriteString writes s with the minimal escaping of RFC 8785: the two
// mandatory escapes, short forms for control characters, \u00XX for the rest
// of them, everything else as UTF-8.
func refWriteString(out *bytes.Buffer, s string) {
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
				out.WriteByte(refHexDigits[r>>4])
				out.WriteByte(refHexDigits[r&0xf])
				continue
			}
			var buf [utf8.UTFMax]byte
			n := utf8.EncodeRune(buf[:], r)
			out.Write(buf[:n])
		}
	}
	out.WriteByte('"')
}
