// Package textcut shapes texts that are stored or sent (error messages in
// records, headers and rows): bounded without splitting a UTF-8 sequence,
// and with the root cause first.
package textcut

import (
	"strings"
	"unicode/utf8"
)

// Cut returns s if it has at most n bytes, otherwise its longest prefix of
// at most n bytes that does not end inside a UTF-8 sequence. A negative n
// is taken as 0.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < 0 {
		n = 0
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// RootFirst is err's text for failure records that an operator reads in a
// narrow column (dead-letter headers, inbox rows): the root cause first,
// then, in brackets, the layers that wrapped it ("insufficient funds [from
// idemsqlite: process (scope "credits", key "m-3"): handler]"), so that a
// cut keeps the cause. The root is the innermost error (the first of a
// join). When the text does not end with the root's (a layer that wrote
// its own words last), or there is nothing around it, it is err's text as
// it is.
func RootFirst(err error) string {
	if err == nil {
		return ""
	}
	full := err.Error()
	root := err
	for {
		var next error
		switch u := root.(type) {
		case interface{ Unwrap() error }:
			next = u.Unwrap()
		case interface{ Unwrap() []error }:
			if errs := u.Unwrap(); len(errs) > 0 {
				next = errs[0]
			}
		}
		if next == nil {
			break
		}
		root = next
	}
	cause := root.Error()
	if cause == "" || cause == full || !strings.HasSuffix(full, cause) {
		return full
	}
	layers := strings.TrimRight(strings.TrimSuffix(full, cause), ": ")
	if layers == "" {
		return full
	}
	return cause + " [from " + layers + "]"
}
