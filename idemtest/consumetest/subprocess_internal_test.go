package consumetest

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTestPattern(t *testing.T) {
	for _, name := range []string{"TestX", "TestX/sub", "TestX/a.b+c(d)#01", "TestX/with_spaces/[x]"} {
		pat := testPattern(name)
		parts := strings.Split(pat, "/")
		names := strings.Split(name, "/")
		if len(parts) != len(names) {
			t.Fatalf("%q: pattern %q has %d levels", name, pat, len(parts))
		}
		for i, p := range parts {
			re := regexp.MustCompile(p)
			if !re.MatchString(names[i]) || re.MatchString(names[i]+"x") || re.MatchString("x"+names[i]) {
				t.Errorf("%q: level %d pattern %q does not select exactly %q", name, i, p, names[i])
			}
		}
	}
}

func TestTailBufferBound(t *testing.T) {
	b := &tailBuffer{max: 10}
	for range 5 {
		b.Write([]byte("0123456789abc"))
	}
	if got := b.String(); got != "3456789abc" {
		t.Errorf("tail %q", got)
	}
}

func TestOneLine(t *testing.T) {
	if got := oneLine("a\nb\rc"); got != "a b c" {
		t.Errorf("%q", got)
	}
	if got := oneLine(strings.Repeat("x", 2000)); len(got) != 1024+len("…") {
		t.Errorf("len %d", len(got))
	}
	if got := oneLine(strings.Repeat("é", 1000)); !utf8.ValidString(got) || len(got) != 1024+len("…") {
		t.Errorf("cut inside a rune or at the wrong place: len %d", len(got))
	}
}
