package idemhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
)

// PrincipalFromHeader returns a Config.Principal that reads the principal
// from a request header set by a gateway that has already authenticated
// the caller. Use it only behind such a gateway: a client that can set the
// header itself can read the responses of any principal it names. A
// request carrying the header more than once is refused (400): which value
// the gateway vouched for cannot be known.
func PrincipalFromHeader(name string) func(*http.Request) (string, error) {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		return single(r, name)
	}
}

// PrincipalFromAuthorization returns a Config.Principal that scopes keys
// by the SHA-256 of the Authorization header, for services that
// authenticate the credential themselves: two different credentials never
// share a key, and the credential itself is never stored. A request with
// more than one Authorization header is refused (400).
func PrincipalFromAuthorization() func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		a, err := single(r, "Authorization")
		if a == "" || err != nil {
			return "", err
		}
		h := sha256.Sum256([]byte(a))
		return "authz-sha256:" + hex.EncodeToString(h[:]), nil
	}
}

// single returns the one value of header name, "" if there is none, or an
// error if there are several.
func single(r *http.Request, name string) (string, error) {
	vs := r.Header.Values(name)
	switch len(vs) {
	case 0:
		return "", nil
	case 1:
		return vs[0], nil
	}
	return "", fmt.Errorf("%d %s headers; send exactly one", len(vs), name)
}
