package idemhttp

import (
	"net/http"
	"strconv"
	"strings"
)

// StoredResponse is a response as the middleware (or the proxy) recorded
// it for a key, for operators' tools that show what a retry would be
// replayed ("idem keys get"). Header holds only the headers that are
// replayed (never Set-Cookie or Authorization).
type StoredResponse struct {
	Status int
	Header http.Header
	Body   []byte
	// Discarded: the handler completed but its response was larger than
	// the capture limit, so only the completion was kept; a retry gets 410.
	Discarded bool
	// Upgraded: the handler took the connection over (101 Switching
	// Protocols); there is nothing to replay.
	Upgraded bool
}

// DecodeStoredResponse decodes the result of a record the middleware
// completed. It fails (wrapping no sentinel; the message says why) on
// anything else, such as a Guard result or an unknown format version.
func DecodeStoredResponse(result []byte) (*StoredResponse, error) {
	s, err := decodeResponse(result)
	if err != nil {
		return nil, err
	}
	return &StoredResponse{Status: s.status, Header: s.header, Body: s.body, Discarded: s.discarded, Upgraded: s.upgraded}, nil
}

// Scope returns the scope the middleware files a request's key under:
// `http "<principal>" <METHOD> <route>` (the principal quoted as Go quotes
// strings; the proxy's principal is the scope header's value or
// "authz-sha256:" and the hex SHA-256 of the Authorization header), or,
// when that is not a valid scope (longer than idem.MaxScopeLen),
// "http sha256:" and a hash of the three. With idem.ScopeHash it finds the
// records of a request in the store and in the logs.
func Scope(principal, method, route string) string {
	return scopeOf(principal, strings.ToUpper(method), route)
}

// ParseScope splits a scope made by [Scope] into its principal, method and
// route; ok is false for any other scope, including the hashed form.
func ParseScope(scope string) (principal, method, route string, ok bool) {
	rest, found := strings.CutPrefix(scope, "http ")
	if !found || !strings.HasPrefix(rest, `"`) {
		return "", "", "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", "", "", false
	}
	principal, err = strconv.Unquote(q)
	if err != nil {
		return "", "", "", false
	}
	method, route, found = strings.Cut(strings.TrimPrefix(rest[len(q):], " "), " ")
	if !found || method == "" || rest[len(q)] != ' ' {
		return "", "", "", false
	}
	return principal, method, route, true
}
