package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/idemprom"
	"github.com/idem-go/idem/idemhttp"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newProxyCmd) }

// proxyOptions are the flags of "idem proxy".
type proxyOptions struct {
	listen, upstream, scopeHeader, maxBody, adminListen string
	inDoubt, errorFormat                                string
	replayHeaders                                       []string
	requireKey                                          bool
	ttl, lease, wait, timeout, upstreamTimeout          time.Duration
	readHeaderTimeout, bodyTimeout, idleTimeout         time.Duration
	shutdown, purgeEvery                                time.Duration
	replayCache                                         time.Duration
	maxConns                                            int
}

func newProxyCmd(a *app) *cobra.Command {
	var (
		o   proxyOptions
		cfg *storeConfig
	)
	cmd := &cobra.Command{
		Use:   "proxy --upstream URL",
		Short: "Run an Idempotency-Key reverse proxy in front of an HTTP API",
		Long: `proxy puts the idemhttp middleware in front of any HTTP API: the first POST or
PATCH with an Idempotency-Key is forwarded and its response stored; retries get
the stored response with "Idempotent-Replayed: true"; a retry while the first is
in flight gets 409, the same key with another body 422. The original
Idempotency-Key header is forwarded, so an idempotent upstream can dedupe too.

A request is forwarded at most once per key. Once forwarded, it runs to the end
on the upstream even if the client goes away or times out: its response is
recorded and the client's retry gets it. Only a request that never reached the
upstream (connection refused) releases its key; one that reached it and got no
answer (--timeout, --upstream-timeout, a dropped connection) is in doubt:
--in-doubt record (the default) records a 502/504 "outcome unknown" answer that
every retry gets, --in-doubt release lets the retry be forwarded again.

Keys are scoped by the principal in --scope-header (set by a gateway that has
authenticated the caller) or else by a SHA-256 of the Authorization header; a
key-carrying request with neither, or with either header repeated, gets 400.
One JSON log line per request goes to stderr. --admin-listen serves /healthz,
/readyz and /metrics on a separate address. SIGTERM stops accepting connections,
lets in-flight requests finish and record their responses (--shutdown-timeout)
and exits 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runProxy(cmd, o, *cfg) },
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to listen on")
	f.StringVar(&o.upstream, "upstream", "", "URL of the API to forward to (required)")
	f.StringVar(&o.scopeHeader, "scope-header", "", "request header carrying the principal authenticated by a gateway")
	f.BoolVar(&o.requireKey, "require-key", false, "answer 400 to a POST or PATCH without an Idempotency-Key")
	f.DurationVar(&o.ttl, "ttl", idem.DefaultRetention, "how long stored responses are replayed")
	f.DurationVar(&o.lease, "lease", 30*time.Second, "lease on a key while its request runs (heartbeated every lease/3; at least 100ms)")
	f.StringVar(&o.maxBody, "max-body", "1MiB", "largest request body accepted, also once decoded from gzip (B, KiB, MiB, GiB, KB, MB, GB)")
	f.DurationVar(&o.wait, "wait", 0, "how long a retry waits for an in-flight first request before 409")
	f.DurationVar(&o.timeout, "timeout", 0, "wait for the upstream's response headers once the request is sent (0: no limit); past it the outcome is in doubt")
	f.DurationVar(&o.upstreamTimeout, "upstream-timeout", 2*time.Minute, "bound on a whole upstream exchange, from forwarding to the last response byte (0: no limit)")
	f.StringVar(&o.inDoubt, "in-doubt", string(idemhttp.InDoubtRecord), "when the upstream got a request and did not answer: record (retries get the outcome-unknown answer) or release (retries are forwarded again)")
	f.StringVar(&o.errorFormat, "error-format", string(idemhttp.FormatProblem), "error responses: problem (RFC 9457) or stripe ({\"error\":{\"type\",\"code\",\"message\"}})")
	f.StringArrayVar(&o.replayHeaders, "replay-header", nil, "response header to store and replay besides Content-Type, Location, ETag, Link, Request-Id, X-Request-Id… (repeatable)")
	f.StringVar(&o.adminListen, "admin-listen", "", "address for /healthz, /readyz and /metrics (empty: off); never the public one")
	f.DurationVar(&o.readHeaderTimeout, "read-header-timeout", 10*time.Second, "time allowed to read a request's headers")
	f.DurationVar(&o.bodyTimeout, "body-timeout", 30*time.Second, "time allowed to read a request's body (0: no limit)")
	f.DurationVar(&o.idleTimeout, "idle-timeout", 60*time.Second, "how long an idle keep-alive connection is kept")
	f.IntVar(&o.maxConns, "max-conns", 1024, "most client connections open at once; more wait to be accepted (0: no limit)")
	f.DurationVar(&o.shutdown, "shutdown-timeout", 30*time.Second, "how long SIGTERM waits for in-flight requests")
	f.DurationVar(&o.purgeEvery, "purge-interval", 10*time.Minute, "how often expired records are purged (0: never)")
	f.DurationVar(&o.replayCache, "replay-cache", idemhttp.DefaultCacheMaxAge,
		"keep completed responses in memory this long (at most 1m) to replay them without the store; a key deleted elsewhere may still be replayed for this long (0: no cache)")
	for name, env := range map[string]string{
		"listen": "IDEM_PROXY_LISTEN", "upstream": "IDEM_PROXY_UPSTREAM", "scope-header": "IDEM_PROXY_SCOPE_HEADER",
		"require-key": "IDEM_PROXY_REQUIRE_KEY", "ttl": "IDEM_PROXY_TTL", "lease": "IDEM_PROXY_LEASE",
		"max-body": "IDEM_PROXY_MAX_BODY", "wait": "IDEM_PROXY_WAIT", "timeout": "IDEM_PROXY_TIMEOUT",
		"upstream-timeout": "IDEM_PROXY_UPSTREAM_TIMEOUT", "in-doubt": "IDEM_PROXY_IN_DOUBT",
		"error-format": "IDEM_PROXY_ERROR_FORMAT", "admin-listen": "IDEM_PROXY_ADMIN_LISTEN",
		"read-header-timeout": "IDEM_PROXY_READ_HEADER_TIMEOUT", "body-timeout": "IDEM_PROXY_BODY_TIMEOUT",
		"idle-timeout": "IDEM_PROXY_IDLE_TIMEOUT", "max-conns": "IDEM_PROXY_MAX_CONNS",
		"shutdown-timeout": "IDEM_PROXY_SHUTDOWN_TIMEOUT", "purge-interval": "IDEM_PROXY_PURGE_INTERVAL",
		"replay-cache": "IDEM_PROXY_REPLAY_CACHE",
	} {
		envFlag(cmd, name, env)
	}
	cfg = addStoreFlags(cmd)
	return cmd
}

// parseSize parses a byte count such as 1048576, 512KiB, 1MiB or 2MB.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("invalid size %q: want a positive byte count such as 1MiB", s)
	}
	return n * mult, nil
}

func (o proxyOptions) validate() (*url.URL, int64, error) {
	if o.upstream == "" {
		return nil, 0, usageErrorf("--upstream is required")
	}
	u, err := url.Parse(o.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, 0, usageErrorf("invalid --upstream %q: want an absolute http:// or https:// URL", redactURL(o.upstream))
	}
	maxBody, err := parseSize(o.maxBody)
	if err != nil {
		return nil, 0, usageErrorf("--max-body: %v", err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--ttl", o.ttl}, {"--lease", o.lease}, {"--read-header-timeout", o.readHeaderTimeout}, {"--idle-timeout", o.idleTimeout}} {
		if d.v <= 0 {
			return nil, 0, usageErrorf("%s must be positive, got %v", d.name, d.v)
		}
	}
	if o.lease < idem.MinLease {
		return nil, 0, usageErrorf("--lease %v is too short: at least %v, to leave room for a few heartbeats (each a store round trip)", o.lease, idem.MinLease)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--wait", o.wait}, {"--timeout", o.timeout}, {"--upstream-timeout", o.upstreamTimeout}, {"--body-timeout", o.bodyTimeout},
		{"--shutdown-timeout", o.shutdown}, {"--purge-interval", o.purgeEvery}, {"--replay-cache", o.replayCache}} {
		if d.v < 0 {
			return nil, 0, usageErrorf("%s must not be negative, got %v", d.name, d.v)
		}
	}
	if o.replayCache > time.Minute {
		return nil, 0, usageErrorf("--replay-cache %v is too long: at most 1m (it bounds how long a deleted key may still be replayed)", o.replayCache)
	}
	if o.maxConns < 0 {
		return nil, 0, usageErrorf("--max-conns must not be negative, got %d", o.maxConns)
	}
	switch idemhttp.InDoubt(o.inDoubt) {
	case idemhttp.InDoubtRecord, idemhttp.InDoubtRelease:
	default:
		return nil, 0, usageErrorf("invalid --in-doubt %q: want record or release", o.inDoubt)
	}
	switch idemhttp.ErrorFormat(o.errorFormat) {
	case idemhttp.FormatProblem, idemhttp.FormatStripe:
	default:
		return nil, 0, usageErrorf("invalid --error-format %q: want problem or stripe", o.errorFormat)
	}
	if o.adminListen != "" && o.adminListen == o.listen && !strings.HasSuffix(o.listen, ":0") {
		return nil, 0, usageErrorf("--admin-listen must differ from --listen: health and metrics never share the public listener")
	}
	return u, maxBody, nil
}

// redactURL hides a password in a URL given on the command line.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return redactDSN(s)
}

// requestLog carries the middleware's verdict on one request to the line
// the proxy logs for it.
type requestLog struct {
	ev  idemhttp.Event
	set bool
}

type requestLogKey struct{}

// requestLogHook is the idemhttp.RequestEndHook that hands the
// middleware's event to the requestLog in the request's context.
type requestLogHook struct{}

func (requestLogHook) OnRequestEnd(ctx context.Context, ev idemhttp.Event) {
	if rl, ok := ctx.Value(requestLogKey{}).(*requestLog); ok {
		rl.ev, rl.set = ev, true
	}
}

// statusWriter remembers the status of a pass-through response.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func runProxy(cmd *cobra.Command, o proxyOptions, cfg storeConfig) error {
	upstream, maxBody, err := o.validate()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	logger := slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), nil))

	store, closeStore, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeStore()
	probeStore(ctx, store, o.lease, logger)

	reg := newAdminRegistry()
	metrics, err := idemprom.New(reg, nil)
	if err != nil {
		return err
	}

	principal := idemhttp.PrincipalFromAuthorization()
	var preserve []string
	if o.scopeHeader != "" {
		principal = idemhttp.PrincipalFromHeader(o.scopeHeader)
		preserve = append(preserve, o.scopeHeader)
	}
	var cache *idemhttp.ReplayCache
	if o.replayCache > 0 {
		cache = &idemhttp.ReplayCache{MaxAge: o.replayCache}
	}
	mw, err := idemhttp.New(store, &idemhttp.Config{
		Cache:         cache,
		RequireKey:    o.requireKey,
		Principal:     principal,
		MaxBodyBytes:  maxBody,
		Lease:         o.lease,
		Retention:     o.ttl,
		Wait:          o.wait,
		ReplayHeaders: o.replayHeaders,
		ErrorFormat:   idemhttp.ErrorFormat(o.errorFormat),
		Logger:        logger,
		Hooks:         []idem.Hook{metrics.For("proxy"), requestLogHook{}},
	})
	if err != nil {
		return usageError{err}
	}
	proxy, err := idemhttp.NewProxy(upstream, mw, &idemhttp.ProxyConfig{
		Timeout:         o.timeout,
		UpstreamTimeout: o.upstreamTimeout,
		InDoubt:         idemhttp.InDoubt(o.inDoubt),
		BodyReadTimeout: o.bodyTimeout,
		PreserveHeaders: preserve,
		Logger:          logger,
	})
	if err != nil {
		return err
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rl := &requestLog{}
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			ev := rl.ev
			if !rl.set {
				ev = idemhttp.Event{Outcome: "passthrough", Status: sw.status}
			}
			attrs := []any{"method", r.Method, "path", r.URL.Path, "outcome", string(ev.Outcome), "status", ev.Status,
				"latency_ms", float64(time.Since(start).Microseconds()) / 1000}
			if ev.Key != "" {
				attrs = append(attrs, "key", ev.Key, "scope_hash", ev.ScopeHash)
			}
			if ev.ClientGone {
				attrs = append(attrs, "client_gone", true)
			}
			if ev.Err != nil {
				attrs = append(attrs, "err", ev.Err.Error())
			}
			logger.Info("request", attrs...)
		}()
		proxy.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), requestLogKey{}, rl)))
	})

	maxConns := o.maxConns
	if limit, ok := fdLimit(); ok && maxConns > 0 && uint64(maxConns)+64 > limit {
		// Leave descriptors for the store, the upstream and the log.
		clamped := max(int(limit)/2, 1)
		logger.Warn("--max-conns exceeds what the open-file limit allows; lowered", "max_conns", o.maxConns,
			"open_file_limit", limit, "now", clamped)
		maxConns = clamped
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	if maxConns > 0 {
		ln = newLimitListener(ln, maxConns)
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: o.readHeaderTimeout,
		IdleTimeout:       o.idleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	var adm *adminServer
	if o.adminListen != "" {
		adm, err = startAdmin(ctx, adminConfig{
			Addr:       o.adminListen,
			PublicAddr: ln.Addr().String(),
			Checks:     []readyCheck{storeReady(store), upstreamReady(upstream)},
			Registry:   reg,
			Logger:     logger,
		})
		if err != nil {
			_ = ln.Close()
			return err
		}
		defer func() { _ = adm.Stop(context.WithoutCancel(ctx)) }()
	}
	fmt.Fprintf(cmd.OutOrStdout(), "idem proxy listening on %s, forwarding to %s, store %s\n",
		ln.Addr(), upstream.Redacted(), redactDSN(cfg.DSN))
	if adm != nil {
		fmt.Fprintf(cmd.OutOrStdout(), "idem proxy admin (/healthz, /readyz, /metrics) on %s\n", adm.Addr())
	}

	purgeDone := make(chan struct{})
	purgeCtx, stopPurge := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(purgeDone)
		purgeLoop(purgeCtx, store, o.purgeEvery, logger)
	}()
	defer func() { stopPurge(); <-purgeDone }()

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	// Stop accepting, let in-flight requests finish: executions run to the
	// end and record their responses even if their clients have gone. Then
	// close the store.
	if adm != nil {
		adm.SetDraining()
	}
	logger.Info("proxy draining", "timeout", o.shutdown)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.shutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: in-flight requests did not finish within %v (their keys stay claimed until their leases expire): %w", o.shutdown, err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("proxy stopped")
	return nil
}

// probeStore times one claim, heartbeat and release against the store, on
// a key of its own, and warns when the store is slow for the lease: a
// heartbeat that takes a large part of the lease puts every key at risk of
// a second execution under load.
func probeStore(ctx context.Context, store idem.Store, lease time.Duration, logger *slog.Logger) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	scope, key := "idem proxy probe "+hex.EncodeToString(b[:]), "probe"
	pctx, cancel := context.WithTimeout(ctx, lease)
	defer cancel()
	var slowest time.Duration
	timed := func(f func() error) error {
		start := time.Now()
		err := f()
		slowest = max(slowest, time.Since(start))
		return err
	}
	var claim idem.Claim
	err := timed(func() (err error) {
		claim, err = store.Claim(pctx, idem.ClaimRequest{Scope: scope, Key: key, Lease: lease})
		return err
	})
	if err == nil && claim.Outcome == idem.Acquired {
		err = timed(func() error { _, err := store.Extend(pctx, scope, key, claim.Token, lease); return err })
		if rerr := timed(func() error { return store.Release(pctx, scope, key, claim.Token) }); err == nil {
			err = rerr
		}
	}
	switch {
	case err != nil:
		logger.Warn("store probe failed; requests will get 503 until the store answers", "err", err.Error())
	case slowest*10 > lease:
		logger.Warn("the store is slow for the lease: a heartbeat may not land in time under load; raise --lease or speed up the store",
			"store_round_trip_ms", float64(slowest.Microseconds())/1000, "lease", lease.String())
	default:
		logger.Info("store probe", "store_round_trip_ms", float64(slowest.Microseconds())/1000, "lease", lease.String())
	}
}

// purgeLoop deletes expired records every interval until ctx ends.
func purgeLoop(ctx context.Context, store idem.Store, every time.Duration, logger *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n, err := store.Purge(ctx, 0); err != nil && ctx.Err() == nil {
			logger.Warn("purge failed", "err", err)
		} else if n > 0 {
			logger.Info("purged expired records", "count", n)
		}
	}
}

// limitListener accepts at most n connections at once; Accept waits for
// one to close beyond that, so a flood of idle connections cannot exhaust
// the process's file descriptors (the kernel's backlog holds the rest).
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
