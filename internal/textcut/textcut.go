// Package textcut bounds texts that are stored or sent (error messages in
// records, headers and rows) without splitting a UTF-8 sequence.
package textcut

import "unicode/utf8"

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
