package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

func init() {
	registerBackend(backend{
		Name:    "Redis",
		Schemes: []string{"redis", "rediss"},
		Example: "redis://HOST:PORT/DB",
		Open:    openRedis,
		// Every record carries a TTL: Redis deletes it when its retention
		// (or its lease) ends.
		ExpiresItself: true,
	})
}

// redisDSNForm ends the errors about the shape of a redis:// DSN.
const redisDSNForm = "want redis://[USER:PASSWORD@]HOST:PORT/DB"

// redisParams are the query parameters a redis:// or rediss:// DSN may
// carry: idem's prefix and strict, and those rueidis.ParseURL reads. Any
// other is refused rather than silently ignored (a misspelt dial_timeout
// would otherwise do nothing).
var redisParams = []string{
	"addr", "client_cache", "client_name", "db", "dial_timeout", "master_set",
	"max_retries", "prefix", "protocol", "skip_verify", "strict", "write_timeout",
}

// redisOptions splits cfg.DSN into the client's options and the store's:
// the query parameters prefix (key prefix) and strict (refuse an evicting
// maxmemory-policy) belong to idem, the rest to rueidis.ParseURL
// (db, dial_timeout, addr for more cluster seeds, …).
//
// Everything that can be checked without a server is checked here, so that
// a malformed DSN never dials (a host:port rueidis cannot use would only
// fail later, after retries). No error repeats the password: the DSN is
// shown through redactDSN, a parse error without the text the parser
// quotes, and redisDSNError masks the password in whatever detail is left.
func redisOptions(dsn string) (rueidis.ClientOption, idemredis.Config, error) {
	var (
		cfg  idemredis.Config
		none rueidis.ClientOption
	)
	fail := func(format string, args ...any) (rueidis.ClientOption, idemredis.Config, error) {
		return none, cfg, redisDSNError(dsn, fmt.Sprintf(format, args...))
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return fail("%s; %s", urlParseCause(err), redisDSNForm)
	}
	if u.Opaque != "" {
		return fail("%s", redisDSNForm)
	}
	if strings.Contains(dsn, "@") && (u.User == nil || strings.ContainsRune(u.Path+u.RawQuery+u.Fragment, '@')) {
		// An '@' after the host: a '/', '?' or '#' in the password ended the
		// user info early, so the "host", path and query hold bits of it.
		return fail("the user info does not end before the host; percent-encode a '/', '?', '#' or '@' in the user name, password or parameters (%%2F, %%3F, %%23, %%40); %s", redisDSNForm)
	}
	if u.Fragment != "" || strings.HasSuffix(dsn, "#") {
		return fail("a '#' fragment has no meaning in a Redis DSN (percent-encode a '#' in the password as %%23); %s", redisDSNForm)
	}
	if err := checkRedisHostPort(u.Host, false); err != nil {
		return fail("%v; %s", err, redisDSNForm)
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		if strings.Contains(db, "/") {
			return fail("path %q is not /DB; %s", u.Path, redisDSNForm)
		}
		if err := checkRedisDB(db); err != nil {
			return fail("%v; %s", err, redisDSNForm)
		}
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return fail("invalid query: %s", urlParseCause(err))
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(redisParams, k) {
			return fail("unknown parameter %q, want one of %s", k, strings.Join(redisParams, ", "))
		}
		if len(q[k]) > 1 && k != "addr" {
			return fail("parameter %s given %d times", k, len(q[k]))
		}
	}
	if db := q.Get("db"); q.Has("db") && checkRedisDB(db) != nil {
		return fail("db=%q is not a number from 0 up", db)
	}
	for _, a := range q["addr"] {
		if err := checkRedisHostPort(a, true); err != nil {
			return fail("addr=%q: %v", a, err)
		}
	}
	if p := q.Get("protocol"); q.Has("protocol") && p != "2" && p != "3" {
		return fail("protocol=%q: want 2 or 3", p)
	}
	if q.Has("skip_verify") && !strings.EqualFold(u.Scheme, "rediss") {
		return fail("skip_verify applies to TLS connections only (rediss://)")
	}
	cfg.Prefix = q.Get("prefix")
	if strings.ContainsAny(cfg.Prefix, "{}") {
		return fail("prefix=%q must not contain '{' or '}'", cfg.Prefix)
	}
	if s := q.Get("strict"); q.Has("strict") {
		if cfg.Strict, err = strconv.ParseBool(s); err != nil {
			return fail("strict=%q is not a boolean", s)
		}
	}
	q.Del("prefix")
	q.Del("strict")
	u.RawQuery = q.Encode()
	opt, err := rueidis.ParseURL(u.String())
	if err != nil {
		return fail("%v; %s", err, redisDSNForm)
	}
	// The CLI never reads through the client-side cache, and servers that
	// speak only RESP2 refuse to enable it.
	opt.DisableCache = true
	return opt, cfg, nil
}

// checkRedisHostPort checks HOST[:PORT] (HOST:PORT when needPort): a
// host, an IPv6 address in brackets, a port from 1 to 65535.
func checkRedisHostPort(hostport string, needPort bool) error {
	host, port := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	} else if needPort || strings.Count(hostport, ":") > 1 && !strings.HasPrefix(hostport, "[") {
		return fmt.Errorf("%q is not HOST:PORT", hostport)
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
	}
	switch {
	case host == "":
		return errors.New("no host")
	case strings.HasPrefix(hostport, "["):
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("%q is not an IPv6 address", host)
		}
	case strings.ContainsAny(host, "[]:/ "):
		return fmt.Errorf("invalid host %q", host)
	}
	if port == "" && needPort {
		return errors.New("no port")
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q is not a number from 1 to 65535", port)
		}
	}
	return nil
}

// checkRedisDB checks a database number.
func checkRedisDB(db string) error {
	if n, err := strconv.Atoi(db); err != nil || n < 0 {
		return fmt.Errorf("database %q is not a number from 0 up", db)
	}
	return nil
}

// urlParseCause is what a url.Parse or url.ParseQuery error says without
// the text it quotes: url.Error repeats the whole DSN, password included,
// and the fragment an EscapeError, InvalidHostError or "invalid port"
// quotes may come from the password, when a '#', '?' or '/' in it made the
// parser end the user info early.
func urlParseCause(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ee url.EscapeError
	var he url.InvalidHostError
	switch {
	case errors.As(err, &ee):
		return `invalid percent-encoding: a "%" must be followed by two hex digits`
	case errors.As(err, &he):
		return "invalid character in host name"
	}
	msg := strings.TrimPrefix(err.Error(), "net/url: ")
	// Drop quoted text: `invalid port ":x" after host` becomes
	// "invalid port after host".
	for {
		i := strings.IndexByte(msg, '"')
		j := strings.IndexByte(msg[i+1:], '"')
		if i < 0 || j < 0 {
			return strings.Join(strings.Fields(msg), " ")
		}
		msg = msg[:i] + msg[i+1+j+1:]
	}
}

// redisDSNError is the error about a malformed DSN: the DSN redacted, then
// detail, with the DSN's password masked in case detail quotes it.
func redisDSNError(dsn, detail string) error {
	for _, pw := range dsnPasswords(dsn) {
		if len(pw) >= 3 {
			detail = strings.ReplaceAll(detail, pw, "xxxxx")
		}
	}
	return fmt.Errorf("invalid --store %q: %s", redactDSN(dsn), detail)
}

// dsnPasswords returns the texts that may be dsn's password: what the URL
// parser finds, or else what stands between "://" and the last '@', as
// written and percent-decoded.
func dsnPasswords(dsn string) []string {
	var out []string
	add := func(s string) {
		if s == "" {
			return
		}
		out = append(out, s)
		if d, err := url.PathUnescape(s); err == nil && d != s {
			out = append(out, d)
		}
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if pw, ok := u.User.Password(); ok {
			add(pw)
			add(url.QueryEscape(pw))
		}
	}
	if _, rest, ok := strings.Cut(dsn, "://"); ok {
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			userinfo := rest[:at]
			if _, pw, ok := strings.Cut(userinfo, ":"); ok {
				add(pw)
				// The part the parser may have taken for a port, a query
				// or a path.
				if i := strings.IndexAny(pw, "#?/"); i > 0 {
					add(pw[:i])
				}
			} else {
				add(userinfo)
			}
		}
	}
	return out
}

func openRedis(ctx context.Context, cfg storeConfig) (idem.Store, func() error, error) {
	opt, scfg, err := redisOptions(cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot connect to Redis at %v: %v; check that the server is running and that --store (IDEM_STORE) is right",
			opt.InitAddress, err)
	}
	s, err := idemredis.New(client, &scfg)
	if err == nil {
		err = s.Ping(ctx)
	}
	if err != nil {
		client.Close()
		if errors.Is(err, idem.ErrInvalidConfig) || errors.Is(err, idemredis.ErrEvictionPolicy) {
			return nil, nil, fmt.Errorf("invalid --store %q: %w", redactDSN(cfg.DSN), err)
		}
		return nil, nil, fmt.Errorf("cannot use Redis at %v: %w", opt.InitAddress, err)
	}
	return s, func() error { client.Close(); return nil }, nil
}
