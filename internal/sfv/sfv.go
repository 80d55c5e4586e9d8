// Package sfv parses the parts of RFC 8941 Structured Field Values that idem
// needs: an Item whose bare item is an sf-string, with optional parameters
// (which are parsed for validity and ignored), and a lenient bare key.
package sfv

import (
	"errors"
	"fmt"
	"strings"
)

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("sfv: syntax error")

// MaxLen bounds the input so that a hostile header costs little to reject.
const MaxLen = 8 << 10

func syntaxErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSyntax, fmt.Sprintf(format, args...))
}

// ParseStringItem parses a field value that is one sf-string Item, such as
// `"abc"` or `"abc";v=1`, and returns the unescaped string. Leading and
// trailing spaces are discarded as RFC 8941 requires; anything else around
// the item (a second list member, for example) is an error.
func ParseStringItem(v string) (string, error) {
	if len(v) > MaxLen {
		return "", syntaxErr("field value is %d bytes, the limit is %d", len(v), MaxLen)
	}
	p := parser{s: strings.TrimLeft(v, " ")}
	s, err := p.str()
	if err != nil {
		return "", err
	}
	if err := p.params(); err != nil {
		return "", err
	}
	p.s = strings.TrimLeft(p.s, " ")
	if p.s != "" {
		return "", syntaxErr("unexpected %q after the item", p.s)
	}
	return s, nil
}

// ParseBareKey accepts the common non-standard form of a key sent without
// quotes: 1*(tchar / ":" / "/" / "="), surrounding spaces discarded. Unlike
// an sf-token it may start with a digit, so bare UUIDs are accepted.
func ParseBareKey(v string) (string, error) {
	s := strings.Trim(v, " ")
	if s == "" {
		return "", syntaxErr("empty value")
	}
	if len(s) > MaxLen {
		return "", syntaxErr("field value is %d bytes, the limit is %d", len(s), MaxLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isTchar(c) && c != ':' && c != '/' && c != '=' {
			return "", syntaxErr("byte 0x%02x at offset %d is not allowed in a bare key", c, i)
		}
	}
	return s, nil
}

type parser struct{ s string }

func (p *parser) str() (string, error) {
	if p.s == "" || p.s[0] != '"' {
		return "", syntaxErr("expected a string starting with '\"'")
	}
	var b strings.Builder
	for i := 1; i < len(p.s); i++ {
		c := p.s[i]
		switch {
		case c == '\\':
			i++
			if i == len(p.s) {
				return "", syntaxErr("unterminated escape")
			}
			if c = p.s[i]; c != '"' && c != '\\' {
				return "", syntaxErr("invalid escape \\%c", c)
			}
			b.WriteByte(c)
		case c == '"':
			p.s = p.s[i+1:]
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", syntaxErr("byte 0x%02x at offset %d is not allowed in a string", c, i)
		default:
			b.WriteByte(c)
		}
	}
	return "", syntaxErr("unterminated string")
}

// params parses *( ";" *SP key [ "=" bare-item ] ) and discards it.
func (p *parser) params() error {
	for p.s != "" && p.s[0] == ';' {
		p.s = strings.TrimLeft(p.s[1:], " ")
		if p.s == "" || !(isLCAlpha(p.s[0]) || p.s[0] == '*') {
			return syntaxErr("invalid parameter key")
		}
		i := 1
		for i < len(p.s) && isKeyChar(p.s[i]) {
			i++
		}
		p.s = p.s[i:]
		if p.s != "" && p.s[0] == '=' {
			p.s = p.s[1:]
			if err := p.bareItem(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *parser) bareItem() error {
	if p.s == "" {
		return syntaxErr("missing parameter value")
	}
	c := p.s[0]
	switch {
	case c == '"':
		_, err := p.str()
		return err
	case c == '-' || isDigit(c):
		i := 0
		if c == '-' {
			i++
		}
		start, dots := i, 0
		for i < len(p.s) && (isDigit(p.s[i]) || p.s[i] == '.') {
			if p.s[i] == '.' {
				dots++
			}
			i++
		}
		if i == start || dots > 1 || p.s[i-1] == '.' || i-start > 20 {
			return syntaxErr("invalid number")
		}
		p.s = p.s[i:]
	case c == '?':
		if len(p.s) < 2 || (p.s[1] != '0' && p.s[1] != '1') {
			return syntaxErr("invalid boolean")
		}
		p.s = p.s[2:]
	case c == ':':
		end := strings.IndexByte(p.s[1:], ':')
		if end < 0 {
			return syntaxErr("unterminated byte sequence")
		}
		for _, b := range []byte(p.s[1 : 1+end]) {
			if !isAlpha(b) && !isDigit(b) && b != '+' && b != '/' && b != '=' {
				return syntaxErr("invalid byte sequence")
			}
		}
		p.s = p.s[end+2:]
	case isAlpha(c) || c == '*':
		i := 1
		for i < len(p.s) && (isTchar(p.s[i]) || p.s[i] == ':' || p.s[i] == '/') {
			i++
		}
		p.s = p.s[i:]
	default:
		return syntaxErr("invalid parameter value")
	}
	return nil
}

func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || (c >= 'A' && c <= 'Z') }
func isKeyChar(c byte) bool {
	return isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

// isTchar reports whether c is an RFC 9110 token character.
func isTchar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
