package canonjson

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		`{"b":1,"a":2}`: `{"a":2,"b":1}`,
		" [ 1 , { \"z\" : [ ] , \"y\" : { } } ] ": `[1,{"y":{},"z":[]}]`,
		`"\u0041\/\ud83d\ude00\u00e9"`:            `"A/😀é"`,
		`{"\n":1,"\"":2,"\\":3,"\u0001":4}`:       `{"\u0001":4,"\n":1,"\"":2,"\\":3}`,
		`{"\ue000":1,"😀":2}`:                      "{\"😀\":2,\"\ue000\":1}", // UTF-16 order puts the surrogate pair first
		`-0.5e+10`:                                `-0.5e+10`,
		`{"a":{"d":[true,false,null],"c":0}}`:     `{"a":{"c":0,"d":[true,false,null]}}`,
	}
	for in, want := range cases {
		got, err := Canonicalize([]byte(in))
		if err != nil || string(got) != want {
			t.Errorf("Canonicalize(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	t.Parallel()
	bad := []string{
		``, ` `, `{`, `[`, `"abc`, `{"a"}`, `{"a":}`, `{a:1}`, `[1,]`, `[,1]`, `{"a":1,}`, `01`, `1.`, `.5`, `1e`, `-`,
		`+1`, `tru`, `nul`, `{"a":1}x`, `{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, "\"a\x01\"", `"\x"`, `"\u12"`,
		`"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, "\"\xff\"", strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
	}
	for _, in := range bad {
		if got, err := Canonicalize([]byte(in)); err == nil {
			t.Errorf("Canonicalize(%q) = %s, want an error", in, got)
		}
	}
	deep := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if _, err := Canonicalize([]byte(deep)); err != nil {
		t.Errorf("nesting of exactly MaxDepth rejected: %v", err)
	}
}

// FuzzAgainstReference checks the scanner against the encoding/json-based
// reference: whatever the scanner accepts, the reference accepts with the
// same output; whatever the reference accepts, the scanner accepts unless
// the document holds invalid UTF-8 or a lone surrogate (which the reference
// silently replaces with U+FFFD, and so cannot fingerprint faithfully).
func FuzzAgainstReference(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,"x",null,true,{"b":[]}]`, `"\u00e9"`, `{"b":1,"a":{"d":2,"c":3}}`, `{"\ue000":1,"😀":2}`, `-1.5E-3`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := Canonicalize(data)
		want, refErr := referenceCanonicalize(data)
		switch {
		case err == nil && refErr != nil:
			if bytes.Count(data, []byte("[")) < 100 { // the reference has no depth limit of its own here
				t.Fatalf("scanner accepted %q, reference said %v", data, refErr)
			}
		case err == nil && !bytes.Equal(got, want):
			t.Fatalf("for %q: scanner %q, reference %q", data, got, want)
		case err != nil && refErr == nil:
			lower := bytes.ToLower(data)
			if utf8.Valid(data) && !bytes.Contains(lower, []byte(`\ud`)) && !strings.Contains(err.Error(), "nesting") {
				t.Fatalf("scanner rejected %q (%v), reference accepted it as %q", data, err, want)
			}
		}
	})
}

func BenchmarkCanonicalize(b *testing.B) {
	doc := []byte(`{"amount": 12345, "currency": "eur", "customer": {"id": "cus_123", "email": "a@example.com",
		"address": {"line1": "1 Main St", "city": "Paris", "country": "FR"}}, "items": [{"sku": "A1", "qty": 2},
		{"sku": "B2", "qty": 1}], "metadata": {"order": "o-42", "note": "leave at the door"}}`)
	b.Run("scanner", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Canonicalize(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reference", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := referenceCanonicalize(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
