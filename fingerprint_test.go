package idem_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

func TestFingerprintJSONIgnoresOrderAndSpace(t *testing.T) {
	t.Parallel()
	same := [][]string{
		{`{"a":1,"b":[1,2,{"y":null,"x":"s"}]}`, " {\n \"b\" : [ 1 , 2 , {\"x\":\"s\",\"y\":null} ] ,\t\"a\" : 1 } "},
		{`{"s":"A"}`, `{"s":"\u0041"}`},
		{`{"s":"é/"}`, `{"s":"\u00e9\/"}`},
		{`[]`, ` [ ] `},
		{`{"\u00e9":1,"z":2}`, `{"z":2,"é":1}`},
	}
	for _, pair := range same {
		a := mustFP(t, pair[0])
		b := mustFP(t, pair[1])
		if a != b {
			t.Errorf("fingerprints differ for %s and %s", pair[0], pair[1])
		}
	}
}

func TestFingerprintJSONSeesRealDifferences(t *testing.T) {
	t.Parallel()
	different := [][]string{
		{`{"amount":100}`, `{"amount":101}`},
		{`{"amount":1}`, `{"amount":1.0}`}, // literal number text is kept
		{`{"amount":"100"}`, `{"amount":100}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":null}`, `{}`},
		{`{"a":"x"}`, `{"a":"X"}`},
		{`{"a":true}`, `{"a":false}`},
		{`{"a":{"b":1}}`, `{"a":{"b":1,"c":2}}`},
		{`12345678901234567890123`, `12345678901234567890124`}, // beyond float64 precision
	}
	for _, pair := range different {
		if mustFP(t, pair[0]) == mustFP(t, pair[1]) {
			t.Errorf("fingerprints equal for %s and %s", pair[0], pair[1])
		}
	}
}

func TestFingerprintJSONRejectsBadInput(t *testing.T) {
	t.Parallel()
	bad := []string{``, `{`, `{"a":1,}`, `{"a":1}{"b":2}`, `{"a":1,"a":2}`, `nul`, `{"a" 1}`, `[1,]`, strings.Repeat("[", 600) + strings.Repeat("]", 600)}
	for _, doc := range bad {
		if _, err := idem.FingerprintJSON([]byte(doc)); err == nil {
			t.Errorf("FingerprintJSON(%.40q) succeeded, want an error", doc)
		}
	}
}

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	got, err := idem.CanonicalJSON([]byte(`{ "b": "line\nbreak\u0001", "a": [true, null, -1.5e3] }`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"a":[true,null,-1.5e3],"b":"line\nbreak\u0001"}`
	if string(got) != want {
		t.Fatalf("CanonicalJSON = %s, want %s", got, want)
	}
}

func TestFingerprintParts(t *testing.T) {
	t.Parallel()
	if idem.FingerprintParts([]byte("ab"), []byte("c")) == idem.FingerprintParts([]byte("a"), []byte("bc")) {
		t.Error("part boundaries must change the fingerprint")
	}
	x1, x2 := idem.FingerprintParts([]byte("x")), idem.FingerprintParts([]byte("x"))
	if x1 != x2 {
		t.Error("fingerprint is not deterministic")
	}
	f := idem.FingerprintBytes([]byte("hello"))
	if f.String() != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Errorf("FingerprintBytes(hello) = %s", f)
	}
	p, err := idem.ParseFingerprint(f.String())
	if err != nil || p != f {
		t.Errorf("ParseFingerprint round trip = %v, %v", p, err)
	}
	if _, err := idem.ParseFingerprint("zz"); err == nil {
		t.Error("ParseFingerprint accepted garbage")
	}
	if !(idem.Fingerprint{}).IsZero() || f.IsZero() {
		t.Error("IsZero is wrong")
	}
}

func mustFP(t *testing.T, doc string) idem.Fingerprint {
	t.Helper()
	f, err := idem.FingerprintJSON([]byte(doc))
	if err != nil {
		t.Fatalf("FingerprintJSON(%s): %v", doc, err)
	}
	return f
}

// FuzzCanonicalJSON checks that canonicalisation is idempotent and that the
// canonical form is itself valid JSON with the same fingerprint.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,"x",null,true,{"b":[]}]`, `"\u00e9"`, `{"b":1,"a":{"d":2,"c":3}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c1, err := idem.CanonicalJSON(data)
		if err != nil {
			return
		}
		c2, err := idem.CanonicalJSON(c1)
		if err != nil {
			t.Fatalf("canonical form %q is not valid JSON: %v", c1, err)
		}
		if string(c1) != string(c2) {
			t.Fatalf("not idempotent: %q -> %q", c1, c2)
		}
	})
}
