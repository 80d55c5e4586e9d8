package idemhttp

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/sfv"
)

// keyInputs are Idempotency-Key values for the parseKey comparisons.
var keyInputs = []string{
	`"abc"`, `""`, `"a b"`, `"a\"b"`, `"a\\b"`, ` "abc"`, `"abc" `, `"abc";x=1`, `"abc`, `abc"`, `"`,
	`"é"`, "\"a\tb\"", `"~!#$%&'()*+,-./:;<=>?@[]^_{|}"`, `"` + strings.Repeat("k", 300) + `"`,
	`"` + strings.Repeat("k", sfv.MaxLen) + `"`, `abc`, `""abc""`,
}

func checkParseKey(t *testing.T, v string) {
	t.Helper()
	if k, ok := plainQuoted(v); ok {
		want, err := sfv.ParseStringItem(v)
		if err != nil || want != k {
			t.Errorf("plainQuoted(%q) = %q; sfv: %q, %v", v, k, want, err)
		}
	}
	got, gotErr := parseKey(v)
	want, wantErr := parseKeySlow(v)
	if got != want || (gotErr == nil) != (wantErr == nil) {
		t.Errorf("parseKey(%q) = %q, %v; want %q, %v", v, got, gotErr, want, wantErr)
	}
}

func TestPlainQuotedAgreesWithSFV(t *testing.T) {
	for _, v := range keyInputs {
		checkParseKey(t, v)
	}
}

func FuzzPlainQuoted(f *testing.F) {
	for _, v := range keyInputs {
		f.Add(v)
	}
	f.Fuzz(checkParseKey)
}

var principalInputs = []string{"", "alice", "a b", `a"b`, `a\b`, "é", "\x00", "\x7f", "a\nb", "authz-sha256:0123abcdef", "\xff"}

func checkQuoted(t *testing.T, s string) {
	t.Helper()
	if got, want := quoted(s), strconv.Quote(s); got != want {
		t.Errorf("quoted(%q) = %s, want %s", s, got, want)
	}
}

func TestQuotedAgreesWithStrconv(t *testing.T) {
	for _, s := range principalInputs {
		checkQuoted(t, s)
	}
	if got, want := Scope("alice", "post", "/p"), `http "alice" POST /p`; got != want {
		t.Errorf("Scope = %q, want %q", got, want)
	}
}

func FuzzQuoted(f *testing.F) {
	for _, s := range principalInputs {
		f.Add(s)
	}
	f.Fuzz(checkQuoted)
}

// TestFPWriterAgreesWithFingerprintParts: the fingerprint of a request
// must not change, or a stored record would answer its retries with 422.
func TestFPWriterAgreesWithFingerprintParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	blob := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	sizes := []int{0, 1, 31, 512, fpBigPart, fpBigPart + 1, 100 << 10, 1 << 20}
	for round := range 40 {
		var (
			parts [][]byte
			fw    = newFPWriter()
		)
		for range 1 + rng.IntN(8) {
			switch rng.IntN(3) {
			case 0:
				s := string(blob(rng.IntN(40)))
				parts = append(parts, []byte(s))
				fw.str(s)
			case 1:
				b := blob(sizes[rng.IntN(len(sizes))])
				parts = append(parts, b)
				fw.bytes(b)
			default:
				vs := make([]string, rng.IntN(4))
				for i := range vs {
					vs[i] = string(blob(rng.IntN(20)))
				}
				parts = append(parts, []byte(strings.Join(vs, "\n")))
				fw.header(vs)
			}
		}
		if got, want := fw.sum(), idem.FingerprintParts(parts...); got != want {
			t.Fatalf("round %d: fpWriter %x, FingerprintParts %x", round, got, want)
		}
	}
}

// TestReplayLinesAreACopy: what is written after the replay's header is
// set (by the code around the middleware) never reaches the cached
// response.
func TestReplayLinesAreACopy(t *testing.T) {
	sr := &storedResponse{status: 201, body: []byte("hello"),
		header: http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}}}
	l := newReplayLines(sr)
	h := http.Header{"Content-Type": {"text/plain"}, "X-Other": {"kept"}}
	l.set(h, "Idempotency-Key", `"k"`)
	want := http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}, "X-Other": {"kept"},
		ReplayedHeader: {"true"}, "Content-Length": {"5"}, "Idempotency-Key": {`"k"`}}
	if !equalHeader(h, want) {
		t.Fatalf("header %v, want %v", h, want)
	}
	for k, vs := range h {
		for i := range vs {
			vs[i] = "changed"
		}
		h[k] = append(vs, "appended")
	}
	h2 := http.Header{}
	l.set(h2, "Idempotency-Key", "")
	delete(want, "X-Other")
	delete(want, "Idempotency-Key")
	if !equalHeader(h2, want) {
		t.Fatalf("second replay: header %v, want %v", h2, want)
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, vs := range a {
		if strings.Join(vs, "\x00") != strings.Join(b[k], "\x00") || len(vs) != len(b[k]) {
			return false
		}
	}
	return true
}

func TestReadAllUsesBufferWhenLargeEnough(t *testing.T) {
	body := []byte(strings.Repeat("x", 600))
	big := make([]byte, 0, 4096)
	got, err := readAll(big, bytes.NewReader(body), int64(len(body)))
	if err != nil || !bytes.Equal(got, body) || &got[:1][0] != &big[:1][0] {
		t.Fatalf("large buffer: err %v, equal %v, same buffer %v", err, bytes.Equal(got, body), &got[:1][0] == &big[:1][0])
	}
	small := make([]byte, 0, 16)
	got, err = readAll(small, bytes.NewReader(body), int64(len(body)))
	if err != nil || !bytes.Equal(got, body) || &got[:1][0] == &small[:1][0] {
		t.Fatalf("small buffer: err %v, equal %v", err, bytes.Equal(got, body))
	}
	// An unknown length (-1) still reads everything.
	got, err = readAll(nil, bytes.NewReader(body), -1)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("unknown length: err %v", err)
	}
}

// TestRawHitNeedsNoFingerprint: an entry is found by the raw digest of the
// request that filled it, without the request's fingerprint (here the
// entry's fingerprint is one no request has; the store is never called).
func TestRawHitNeedsNoFingerprint(t *testing.T) {
	m, err := New(nopStore{}, &Config{SharedScope: true, Cache: &ReplayCache{}})
	if err != nil {
		t.Fatal(err)
	}
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/p?x=1", strings.NewReader(`{"a":1}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(DefaultHeaderName, `"k"`)
		return r
	}
	c, p := m.checkHead(req())
	if p != nil {
		t.Fatal(p)
	}
	m.cache.put(c.call.Scope, c.call.Key, idem.Fingerprint{1}, m.rawFingerprint(req(), &c, []byte(`{"a":1}`)),
		&storedResponse{status: 201, header: http.Header{"Content-Type": {"application/json"}}, body: []byte(`{"id":1}`)}, time.Time{})
	for range 3 {
		w := httptest.NewRecorder()
		m.Handler(http.NotFoundHandler()).ServeHTTP(w, req())
		if w.Code != 201 || w.Body.String() != `{"id":1}` || w.Header().Get(ReplayedHeader) != "true" || w.Header().Get(DefaultHeaderName) != `"k"` {
			t.Fatalf("replay: %d %v %s", w.Code, w.Header(), w.Body)
		}
	}
}
