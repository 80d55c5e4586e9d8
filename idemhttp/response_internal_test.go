package idemhttp

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
)

func TestStoredResponseRoundTrip(t *testing.T) {
	t.Parallel()
	in := &storedResponse{status: 201, header: http.Header{"Location": {"/a"}, "Link": {"<a>", "<b>"}}, body: []byte("hello")}
	out, err := decodeResponse(in.encode())
	if err != nil || out.status != 201 || !reflect.DeepEqual(out.header, in.header) || string(out.body) != "hello" || out.discarded {
		t.Fatalf("%+v %v", out, err)
	}
	d, err := decodeResponse((&storedResponse{status: 200, discarded: true}).encode())
	if err != nil || !d.discarded {
		t.Fatalf("%+v %v", d, err)
	}
	good := in.encode()
	bad := [][]byte{nil, []byte("XX\x01\x00\x00\xc8\x00\x00\x00\x00"), append([]byte("IH\x02"), good[3:]...),
		good[:len(good)-1], append(bytes.Clone(good), 'x'), []byte("IH\x01\x00\x00\x05\x00\x00\x00\x00\x00\x00"),
		[]byte("IH\x01\x00\x00\xc8\x00\x01\x00\x01:\x00\x00\x00\x00\x00\x00"),
		[]byte("IH\x01\x00\x00\xc8\xff\xff")}
	for _, b := range bad {
		if _, err := decodeResponse(b); !errors.Is(err, errCorrupt) {
			t.Errorf("decode(%q): %v", b, err)
		}
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add((&storedResponse{status: 201, header: http.Header{"Location": {"/a"}}, body: []byte("x")}).encode())
	f.Add((&storedResponse{status: 200, discarded: true}).encode())
	f.Add([]byte("IH\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeResponse(b)
		if err != nil {
			return
		}
		// Whatever decodes must encode back to a form that decodes the same.
		s2, err := decodeResponse(s.encode())
		if err != nil || s2.status != s.status || !bytes.Equal(s2.body, s.body) || !reflect.DeepEqual(s2.header, s.header) {
			t.Fatalf("round trip: %+v vs %+v, %v", s, s2, err)
		}
	})
}

// FuzzFingerprint checks that the request fingerprint ignores JSON member
// order and white space, and that parsing never panics.
func FuzzFingerprint(f *testing.F) {
	f.Add(`{"a":1,"b":[1,2]}`, `k`)
	f.Add(`[]`, `"k"`)
	f.Add(`{"a":`, `"k";x=1`)
	m, err := New(nopStore{}, &Config{SharedScope: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body, key string) {
		mk := func(b string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, "http://x/p", bytes.NewBufferString(b))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", key)
			return r
		}
		c1, err1 := m.Check(mk(body))
		if err1 != nil {
			var p *Problem
			if !errors.As(err1, &p) || p.Status < 400 {
				t.Fatalf("error is not a problem: %v", err1)
			}
			return
		}
		// Wrapping the document in an array with spaces changes it; the
		// same document re-spaced does not.
		c2, err2 := m.Check(mk(" \n" + body + "\t "))
		if err2 != nil || c1 != c2 {
			t.Fatalf("re-spaced body: %v, %v", err2, c1 != c2)
		}
	})
}
