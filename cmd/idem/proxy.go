package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newProxyCmd) }

// proxyOptions are the flags of "idem proxy".
type proxyOptions struct {
	listen, upstream, scopeHeader, maxBody string
	requireKey                             bool
	ttl, lease, wait, timeout, shutdown    time.Duration
	purgeEvery                             time.Duration
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

Keys are scoped by the principal in --scope-header (set by a gateway that has
authenticated the caller) or else by a SHA-256 of the Authorization header; a
key-carrying request with neither gets 400. One JSON log line per request goes
to stderr. SIGTERM stops accepting connections, lets in-flight requests finish
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
	f.DurationVar(&o.lease, "lease", 30*time.Second, "lease on a key while its request runs (heartbeated every lease/3)")
	f.StringVar(&o.maxBody, "max-body", "1MiB", "largest request body accepted (B, KiB, MiB, GiB, KB, MB, GB)")
	f.DurationVar(&o.wait, "wait", 0, "how long a retry waits for an in-flight first request before 409")
	f.DurationVar(&o.timeout, "timeout", 0, "wait for the upstream's response headers before 504 (0: no limit)")
	f.DurationVar(&o.shutdown, "shutdown-timeout", 30*time.Second, "how long SIGTERM waits for in-flight requests")
	f.DurationVar(&o.purgeEvery, "purge-interval", 10*time.Minute, "how often expired records are purged (0: never)")
	for name, env := range map[string]string{
		"listen": "IDEM_PROXY_LISTEN", "upstream": "IDEM_PROXY_UPSTREAM", "scope-header": "IDEM_PROXY_SCOPE_HEADER",
		"require-key": "IDEM_PROXY_REQUIRE_KEY", "ttl": "IDEM_PROXY_TTL", "lease": "IDEM_PROXY_LEASE",
		"max-body": "IDEM_PROXY_MAX_BODY", "wait": "IDEM_PROXY_WAIT", "timeout": "IDEM_PROXY_TIMEOUT",
		"shutdown-timeout": "IDEM_PROXY_SHUTDOWN_TIMEOUT", "purge-interval": "IDEM_PROXY_PURGE_INTERVAL",
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
		return nil, 0, usageErrorf("invalid --upstream %q: want an absolute http:// or https:// URL", o.upstream)
	}
	maxBody, err := parseSize(o.maxBody)
	if err != nil {
		return nil, 0, usageErrorf("--max-body: %v", err)
	}
	for name, d := range map[string]time.Duration{"--ttl": o.ttl, "--lease": o.lease} {
		if d <= 0 {
			return nil, 0, usageErrorf("%s must be positive, got %v", name, d)
		}
	}
	for name, d := range map[string]time.Duration{"--wait": o.wait, "--timeout": o.timeout, "--purge-interval": o.purgeEvery} {
		if d < 0 {
			return nil, 0, usageErrorf("%s must not be negative, got %v", name, d)
		}
	}
	return u, maxBody, nil
}

// requestLog carries the middleware's verdict on one request to the line
// the proxy logs for it.
type requestLog struct {
	ev  idemhttp.Event
	set bool
}

type requestLogKey struct{}

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

	principal := idemhttp.PrincipalFromAuthorization()
	if o.scopeHeader != "" {
		principal = idemhttp.PrincipalFromHeader(o.scopeHeader)
	}
	mw, err := idemhttp.New(store, &idemhttp.Config{
		RequireKey:   o.requireKey,
		Principal:    principal,
		MaxBodyBytes: maxBody,
		Lease:        o.lease,
		Retention:    o.ttl,
		Wait:         o.wait,
		Logger:       logger,
		OnRequest: func(r *http.Request, e idemhttp.Event) {
			if rl, ok := r.Context().Value(requestLogKey{}).(*requestLog); ok {
				rl.ev, rl.set = e, true
			}
		},
	})
	if err != nil {
		return err
	}
	proxy, err := idemhttp.NewProxy(upstream, mw, &idemhttp.ProxyConfig{Timeout: o.timeout, Logger: logger})
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
			if ev.Err != nil {
				attrs = append(attrs, "err", ev.Err.Error())
			}
			logger.Info("request", attrs...)
		}()
		proxy.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), requestLogKey{}, rl)))
	})

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	fmt.Fprintf(cmd.OutOrStdout(), "idem proxy listening on %s, forwarding to %s, store %s\n",
		ln.Addr(), upstream.Redacted(), redactDSN(cfg.DSN))

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
	// Stop accepting, let in-flight requests finish (they complete or
	// release their keys), then close the store.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.shutdown)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: in-flight requests did not finish within %v: %w", o.shutdown, err)
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	logger.Info("proxy stopped")
	return nil
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
