package sfv

import (
	"errors"
	"strings"
	"testing"
)

func TestParseStringItem(t *testing.T) {
	t.Parallel()
	ok := map[string]string{
		`"abc"`:                 "abc",
		`  "abc"  `:             "abc",
		`"a\"b\\c"`:             `a"b\c`,
		`"abc";v=1`:             "abc",
		`"abc"; a=?1;b="x";c=d`: "abc",
		`"abc";k=:aGk=:;n=-1.5`: "abc",
		`""`:                    "",
	}
	for in, want := range ok {
		got, err := ParseStringItem(in)
		if err != nil || got != want {
			t.Errorf("ParseStringItem(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{``, `abc`, `"abc`, `"abc", "def"`, `"a\x"`, "\"a\tb\"", `"abc";`, `"abc";A=1`,
		`"abc";a=`, `"abc";a=?2`, `"abc";a=:x`, `"abc";a=1.`, `"abc";a=@`, `"abc" x`, "\"\xc3\xa9\"", `"a\`,
		strings.Repeat("a", MaxLen+1)}
	for _, in := range bad {
		if _, err := ParseStringItem(in); !errors.Is(err, ErrSyntax) {
			t.Errorf("ParseStringItem(%q): err = %v, want ErrSyntax", in, err)
		}
	}
}

func TestParseBareKey(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"abc", " 8e03978e-40d5-43e8-bc93-6894a57f9324 ", "a:b/c=", "*x"} {
		if _, err := ParseBareKey(in); err != nil {
			t.Errorf("ParseBareKey(%q): %v", in, err)
		}
	}
	for _, in := range []string{"", "  ", "a b", "a,b", `a"b`, "a;b", "é", strings.Repeat("a", MaxLen+1)} {
		if _, err := ParseBareKey(in); !errors.Is(err, ErrSyntax) {
			t.Errorf("ParseBareKey(%q): err = %v, want ErrSyntax", in, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b";v=1`, "abc", `"x";a=:aGk=:`, `1`, `"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if s, err := ParseStringItem(in); err == nil {
			for i := 0; i < len(s); i++ {
				if s[i] < 0x20 || s[i] > 0x7e {
					t.Fatalf("ParseStringItem(%q) returned non-printable %q", in, s)
				}
			}
			// Re-serialising and parsing again must give the same string.
			q := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
			if s2, err := ParseStringItem(q); err != nil || s2 != s {
				t.Fatalf("round trip of %q: %q, %v", s, s2, err)
			}
		}
		if s, err := ParseBareKey(in); err == nil && (s == "" || strings.ContainsAny(s, " \",;\\")) {
			t.Fatalf("ParseBareKey(%q) accepted %q", in, s)
		}
	})
}
