package idemhttp

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
)

// PrincipalFromHeader returns a Config.Principal that reads the principal
// from a request header set by a gateway that has already authenticated
// the caller. Use it only behind such a gateway: a client that can set the
// header itself can read the responses of any principal it names.
func PrincipalFromHeader(name string) func(*http.Request) (string, error) {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		return r.Header.Get(name), nil
	}
}

// PrincipalFromAuthorization returns a Config.Principal that scopes keys
// by the SHA-256 of the Authorization header, for services that
// authenticate the credential themselves: two different credentials never
// share a key, and the credential itself is never stored.
func PrincipalFromAuthorization() func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		a := r.Header.Get("Authorization")
		if a == "" {
			return "", nil
		}
		h := sha256.Sum256([]byte(a))
		return "authz-sha256:" + hex.EncodeToString(h[:]), nil
	}
}
