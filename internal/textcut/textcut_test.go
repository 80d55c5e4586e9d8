package textcut

import (
	"errors"
	"fmt"
	"testing"
)

func TestCut(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"", 3, ""},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"abc", 0, ""},
		{"abc", -1, ""},
		{"aé", 2, "a"},  // é is 2 bytes: not split
		{"aé", 3, "aé"}, // fits
		{"€uro", 2, ""}, // € is 3 bytes
		{"€uro", 4, "€u"},
	} {
		if got := Cut(c.s, c.n); got != c.want {
			t.Errorf("Cut(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}

func TestRootFirst(t *testing.T) {
	funds := errors.New("insufficient funds")
	wrapped := fmt.Errorf(`idemsqlite: process (scope "credits", key "m-3"): handler: %w`, funds)
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"bare", funds, "insufficient funds"},
		{"wrapped", wrapped, `insufficient funds [from idemsqlite: process (scope "credits", key "m-3"): handler]`},
		{"twice", fmt.Errorf("consume: %w", wrapped), `insufficient funds [from consume: idemsqlite: process (scope "credits", key "m-3"): handler]`},
		{"joined", fmt.Errorf("run: %w", errors.Join(funds)), "insufficient funds [from run]"},
		{"own words last", fmt.Errorf("%w (retried 3 times)", funds), "insufficient funds (retried 3 times)"},
		{"opaque", fmt.Errorf("handler: %v", funds), "handler: insufficient funds"},
	} {
		if got := RootFirst(c.err); got != c.want {
			t.Errorf("%s: RootFirst = %q, want %q", c.name, got, c.want)
		}
	}
}
