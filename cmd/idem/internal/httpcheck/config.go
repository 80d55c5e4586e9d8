package httpcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Bounds of a run, so that it cannot become a load test of anyone's
// production.
const (
	// MaxRequests bounds Config.Requests, the storm's size.
	MaxRequests = 100
	// MaxRate bounds Config.Rate, in requests per second.
	MaxRate = 1000
	// MaxTTL bounds Config.TTL, which the expiry check waits out once.
	MaxTTL = 10 * time.Minute
	// MaxBodyBytes bounds the request body and every response body read.
	MaxBodyBytes = 1 << 20
	// extraRequests is what the checks other than the storm may send,
	// polling of 409s included.
	extraRequests = 150
)

// Defaults of the zero Config fields.
const (
	DefaultKeyHeader      = "Idempotency-Key"
	DefaultReplayHeader   = "Idempotent-Replayed"
	DefaultMismatchStatus = http.StatusUnprocessableEntity
	DefaultRequests       = 20
	DefaultRate           = 50
	DefaultTimeout        = 10 * time.Second
)

// Config is what a run checks and how.
type Config struct {
	// URL is the endpoint, an absolute http:// or https:// URL.
	URL string
	// Method is the request method (POST when empty).
	Method string
	// Body is sent with every request (the key checks send it under
	// different keys); Header with every request (Content-Type defaults to
	// application/json when Body is set).
	Body   []byte
	Header http.Header
	// KeyHeader names the key header (Idempotency-Key when empty).
	KeyHeader string
	// RequireKey: the endpoint must answer 400 to a request without a key.
	RequireKey bool
	// MismatchBody is sent under a used key by the mismatch check; when
	// nil, a member "idem_verify_mismatch" is added to a JSON object Body.
	MismatchBody []byte
	// MismatchStatus is the status expected for it (422 when zero).
	MismatchStatus int
	// ReplayHeader is the replay marker, a header whose value "true" marks
	// a replayed response (Idempotent-Replayed when empty).
	ReplayHeader string
	// CountURL, when set, is fetched with GET (and Header) before and after
	// the checks that count: its body is the number of executions, or a
	// JSON document holding it at CountPointer.
	CountURL, CountPointer string
	// Same is a JSON pointer (such as /id) into a response body whose value
	// identifies one execution: equal for a replay, different for a new run.
	Same string
	// PrincipalA and PrincipalB are the headers of two principals, set over
	// Header in the scope isolation check (skipped when either is empty).
	PrincipalA, PrincipalB http.Header
	// TTL is the server's retention of a key; the expiry check waits it out
	// once (skipped when zero).
	TTL time.Duration
	// Requests is the storm's size (DefaultRequests when zero, 2 to
	// MaxRequests); Rate bounds every request, in requests per second
	// (DefaultRate when zero), with bursts of Requests.
	Requests int
	Rate     float64
	// Timeout bounds each request (DefaultTimeout when zero).
	Timeout time.Duration
	// AllowRemote lets the run connect to addresses other than loopback:
	// for a target the user owns.
	AllowRemote bool
}

// ErrConfig is matched (errors.Is) by every error of a Config that cannot
// run. The errors name the CLI's flags: the package is the CLI's.
var ErrConfig = errors.New("httpcheck: invalid configuration")

// configError is an error of a Config, in the words of the CLI's flags.
type configError struct{ msg string }

func (e configError) Error() string        { return e.msg }
func (e configError) Is(target error) bool { return target == ErrConfig }

func configErrorf(format string, args ...any) error {
	return configError{fmt.Sprintf(format, args...)}
}

// normalize fills the defaults and refuses what cannot run.
func (c *Config) normalize() (*url.URL, error) {
	u, err := url.Parse(c.URL)
	if c.URL == "" {
		return nil, configErrorf("--url is required")
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, configErrorf("invalid --url %q: want an absolute http:// or https:// URL", redactURL(c.URL))
	}
	if c.Method == "" {
		c.Method = http.MethodPost
	}
	if !isToken(c.Method) {
		return nil, configErrorf("invalid --method %q", cut(c.Method, 20))
	}
	c.Method = strings.ToUpper(c.Method)
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if !isToken(c.KeyHeader) {
		return nil, configErrorf("invalid --key-header %q: want a header name", cut(c.KeyHeader, 40))
	}
	if c.ReplayHeader == "" {
		c.ReplayHeader = DefaultReplayHeader
	}
	if !isToken(c.ReplayHeader) {
		return nil, configErrorf("invalid --replay-header %q: want a header name", cut(c.ReplayHeader, 40))
	}
	if c.MismatchStatus == 0 {
		c.MismatchStatus = DefaultMismatchStatus
	}
	if c.MismatchStatus < 400 || c.MismatchStatus > 499 {
		return nil, configErrorf("--mismatch-status must be a 4xx, got %d", c.MismatchStatus)
	}
	if c.Requests == 0 {
		c.Requests = DefaultRequests
	}
	if c.Requests < 2 || c.Requests > MaxRequests {
		return nil, configErrorf("--requests must be 2-%d, got %d", MaxRequests, c.Requests)
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Rate < 1 || c.Rate > MaxRate {
		return nil, configErrorf("--rate must be 1-%d requests per second, got %v", MaxRate, c.Rate)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Timeout < 0 {
		return nil, configErrorf("--timeout must be positive, got %v", c.Timeout)
	}
	if c.TTL < 0 || c.TTL > MaxTTL {
		return nil, configErrorf("--ttl must be 0 (no expiry check) to %v, got %v", MaxTTL, c.TTL)
	}
	if len(c.Body) > MaxBodyBytes || len(c.MismatchBody) > MaxBodyBytes {
		return nil, configErrorf("a request body is limited to %d bytes", MaxBodyBytes)
	}
	for _, p := range []struct{ flag, v string }{{"--count-pointer", c.CountPointer}, {"--same", c.Same}} {
		if p.v != "" && !strings.HasPrefix(p.v, "/") {
			return nil, configErrorf("%s %q is not a JSON pointer: want one such as /id", p.flag, cut(p.v, 40))
		}
	}
	if c.CountPointer != "" && c.CountURL == "" {
		return nil, configErrorf("--count-pointer needs --count-url")
	}
	if c.CountURL != "" {
		cu, err := url.Parse(c.CountURL)
		if err != nil || (cu.Scheme != "http" && cu.Scheme != "https") || cu.Host == "" {
			return nil, configErrorf("invalid --count-url %q: want an absolute http:// or https:// URL", redactURL(c.CountURL))
		}
	}
	if (len(c.PrincipalA) == 0) != (len(c.PrincipalB) == 0) {
		return nil, configErrorf("scope isolation needs the headers of two principals: give both --principal-a and --principal-b")
	}
	for _, h := range []http.Header{c.Header, c.PrincipalA, c.PrincipalB} {
		for name := range h {
			switch http.CanonicalHeaderKey(name) {
			case http.CanonicalHeaderKey(c.KeyHeader):
				return nil, configErrorf("header %s is set by each check (a fresh key each); name it with --key-header", name)
			case "Content-Length", "Transfer-Encoding", "Connection", "Host":
				return nil, configErrorf("header %s cannot be set", name)
			}
		}
	}
	c.Header = c.Header.Clone()
	if c.Header == nil {
		c.Header = http.Header{}
	}
	if len(c.Body) > 0 && c.Header.Get("Content-Type") == "" {
		c.Header.Set("Content-Type", "application/json")
	}
	return u, nil
}

// ParseHeader parses one "Name: value" header line as curl's -H takes it.
func ParseHeader(line string) (name, value string, err error) {
	name, value, ok := strings.Cut(line, ":")
	name, value = strings.TrimSpace(name), strings.TrimSpace(value)
	switch {
	// The line is never echoed whole: its value may be a credential.
	case !ok:
		return "", "", fmt.Errorf("header starting %q: want Name: value", firstWord(line))
	case !isToken(name):
		return "", "", fmt.Errorf("header starting %q: invalid name (want letters, digits and -)", firstWord(name))
	}
	for _, r := range value {
		if (r < 0x20 && r != '\t') || r == 0x7f {
			return "", "", fmt.Errorf("header %s: its value holds a control character", name)
		}
	}
	return name, value, nil
}

// ParseBody reads a body given as @path (a file, up to MaxBodyBytes) or as
// literal JSON, which must be valid.
func ParseBody(s string) ([]byte, error) {
	if path, ok := strings.CutPrefix(s, "@"); ok {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("body: %w", err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, MaxBodyBytes+1))
		if err != nil {
			return nil, fmt.Errorf("body: read %s: %w", path, err)
		}
		if len(b) > MaxBodyBytes {
			return nil, fmt.Errorf("body: %s is larger than %d bytes", path, MaxBodyBytes)
		}
		return b, nil
	}
	if len(s) > MaxBodyBytes {
		return nil, fmt.Errorf("body: larger than %d bytes", MaxBodyBytes)
	}
	if !json.Valid([]byte(s)) {
		return nil, errors.New("body: not valid JSON (give JSON, or @file for any other body)")
	}
	return []byte(s), nil
}

// isToken reports whether s is an RFC 9110 token (a header name, a method).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// firstWord is the start of s up to its first space, at most 24 bytes.
func firstWord(s string) string {
	w, _, _ := strings.Cut(strings.TrimSpace(s), " ")
	return cut(w, 24)
}

// checkLoopback resolves the host of u, given by flag, and refuses it
// unless every address is a loopback address.
func checkLoopback(ctx context.Context, flag string, u *url.URL) error {
	host := u.Hostname()
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		if err != nil {
			return fmt.Errorf("%s: resolve %s: %w", flag, host, err)
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return remoteError{fmt.Sprintf("%s: %s is %s, not a loopback address; only a target you own and may load can be checked, with --i-own-this-target",
				flag, host, ip)}
		}
	}
	return nil
}

// ErrRemote is matched (errors.Is) by the refusal of a target that is not
// loopback.
var ErrRemote = errors.New("httpcheck: remote target refused")

type remoteError struct{ msg string }

func (e remoteError) Error() string        { return e.msg }
func (e remoteError) Is(target error) bool { return target == ErrRemote }

// redactURL is s as it may be shown: see safeURL.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return safeURL(u)
	}
	return "(unparsable URL)"
}

// safeURL is u as it may be shown: without its password, and with the
// values of query parameters whose names look like credentials (token,
// api_key, …) hidden.
func safeURL(u *url.URL) string {
	c := *u
	if q := c.Query(); len(q) > 0 {
		hidden := false
		for name := range q {
			if sensitive(strings.ReplaceAll(name, "_", "-")) {
				q[name], hidden = []string{"xxxxx"}, true
			}
		}
		if hidden {
			c.RawQuery = q.Encode()
		}
	}
	return c.Redacted()
}
