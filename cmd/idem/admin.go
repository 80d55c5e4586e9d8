package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The admin server answers an orchestrator and a metrics scraper on a
// listener of its own, never on the public one:
//
//	GET /healthz  200 "ok" while the process serves (liveness: no dependency is checked)
//	GET /readyz   200 when every readiness check passes, else 503 naming the failing ones;
//	              503 "draining" once shutdown has begun
//	GET /metrics  Prometheus exposition of the registry
//
// Any other path is 404.

// defaultAdminCheckTimeout bounds each readiness check unless
// adminConfig.CheckTimeout says otherwise.
const defaultAdminCheckTimeout = 2 * time.Second

// maxAdminCheckTimeout keeps a readiness check well inside the admin
// server's write timeout.
const maxAdminCheckTimeout = 20 * time.Second

// The admin server's connection limits: a probe or a scrape is small and
// quick, so a slow or idle client is cut off.
const (
	adminReadHeaderTimeout = 5 * time.Second
	adminReadTimeout       = 10 * time.Second
	adminWriteTimeout      = 30 * time.Second
	adminIdleTimeout       = 60 * time.Second
	adminMaxHeaderBytes    = 16 << 10
)

// readyCheck is one named readiness check. Check must return promptly when
// ctx ends; its error is shown on /readyz as one redacted line.
type readyCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// adminConfig configures [startAdmin].
type adminConfig struct {
	// Addr is where the admin server listens, e.g. 127.0.0.1:9090
	// (port 0 picks a free one; see adminServer.Addr).
	Addr string
	// PublicAddr is the proxy's own listen address. startAdmin refuses an
	// Addr that would be the same socket, so that health and metrics are
	// never served to the public.
	PublicAddr string
	// Checks run concurrently on every /readyz, each bounded by
	// CheckTimeout. Names must be unique and not empty.
	Checks []readyCheck
	// CheckTimeout bounds each check. Default 2s; at most 20s.
	CheckTimeout time.Duration
	// Registry is served on /metrics; promhttp's own scrape counters are
	// registered in it too. Default newAdminRegistry().
	Registry *prometheus.Registry
	// Logger receives readiness changes and server errors. Default: none.
	Logger *slog.Logger
}

// adminServer is a running admin server. Its methods are safe for
// concurrent use.
type adminServer struct {
	addr     string
	srv      *http.Server
	checks   []readyCheck
	timeout  time.Duration
	logger   *slog.Logger
	draining atomic.Bool

	// base is the context of readiness checks; Stop cancels it.
	base   context.Context
	cancel context.CancelFunc
	served chan struct{} // closed when Serve has returned

	mu sync.Mutex
	// run is the readiness evaluation in progress, which concurrent
	// /readyz requests share so that a crowd of probes costs one round.
	run *readyRun
	// lastFailing is the failing checks of the latest evaluation, to log
	// changes only; nil before the first.
	lastFailing *string

	stopOnce sync.Once
	stopErr  error
}

// readyRun is one evaluation of the readiness checks.
type readyRun struct {
	done    chan struct{}
	results []checkResult
	// joined counts the requests that waited for this run besides the one
	// that started it.
	joined int
}

// checkResult is one check's outcome: err is "" when it passed.
type checkResult struct {
	name, err string
}

// newAdminRegistry returns a registry with the Go runtime and process
// collectors. Register the proxy's own metrics (idemprom.New) in it too.
func newAdminRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// startAdmin listens on cfg.Addr and serves /healthz, /readyz and /metrics
// until Stop. ctx bounds only the start (the listen call): the server keeps
// answering while the proxy drains after its context ends, so stop it
// explicitly, after the public server has shut down.
func startAdmin(ctx context.Context, cfg adminConfig) (*adminServer, error) {
	if strings.TrimSpace(cfg.Addr) == "" {
		return nil, errors.New("admin server: empty listen address")
	}
	if cfg.PublicAddr != "" && sameListenAddr(cfg.Addr, cfg.PublicAddr) {
		return nil, fmt.Errorf("admin server: address %s is the public listen address %s; health and metrics must not be served to the public, pick another port", cfg.Addr, cfg.PublicAddr)
	}
	timeout := cfg.CheckTimeout
	if timeout == 0 {
		timeout = defaultAdminCheckTimeout
	}
	if timeout < 0 || timeout > maxAdminCheckTimeout {
		return nil, fmt.Errorf("admin server: readiness check timeout %v must be between 0 and %v", timeout, maxAdminCheckTimeout)
	}
	seen := map[string]bool{}
	for _, c := range cfg.Checks {
		if c.Name == "" || c.Check == nil {
			return nil, fmt.Errorf("admin server: readiness check %q has no name or no function", c.Name)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("admin server: readiness check %q given twice", c.Name)
		}
		seen[c.Name] = true
	}
	reg := cfg.Registry
	if reg == nil {
		reg = newAdminRegistry()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("admin server: listen on %s: %w", cfg.Addr, err)
	}
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a := &adminServer{
		addr:    ln.Addr().String(),
		checks:  append([]readyCheck(nil), cfg.Checks...),
		timeout: timeout,
		logger:  logger,
		base:    base,
		cancel:  cancel,
		served:  make(chan struct{}),
	}
	errLog := slog.NewLogLogger(logger.Handler(), slog.LevelWarn)
	mux := http.NewServeMux()
	// "GET /x" also matches HEAD; other methods get 405.
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:            errLog,
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             adminWriteTimeout - 5*time.Second,
	})))
	a.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: adminReadHeaderTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    adminMaxHeaderBytes,
		ErrorLog:          errLog,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	go func() {
		defer close(a.served)
		if err := a.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("admin server stopped", "addr", a.addr, "err", err)
		}
	}()
	return a, nil
}

// Addr returns the address the admin server listens on (with the port
// chosen when cfg.Addr had port 0).
func (a *adminServer) Addr() string { return a.addr }

// SetDraining makes /readyz answer 503 "draining" from now on, so that a
// load balancer stops sending traffic while in-flight requests finish.
// /healthz keeps answering 200.
func (a *adminServer) SetDraining() {
	if !a.draining.Swap(true) {
		a.logger.Info("admin: draining; /readyz now answers 503")
	}
}

// Stop closes the listener, cancels running readiness checks and waits for
// the requests in flight until ctx ends, then closes what is left. It
// returns once the server's goroutines are gone; later calls return the
// first call's result.
func (a *adminServer) Stop(ctx context.Context) error {
	a.stopOnce.Do(func() {
		a.cancel()
		if err := a.srv.Shutdown(ctx); err != nil {
			a.stopErr = fmt.Errorf("admin server: shutdown: %w", err)
			_ = a.srv.Close()
		}
		<-a.served
	})
	return a.stopErr
}

func (a *adminServer) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, "ok\n")
}

// readyzBody is the JSON /readyz answers: status is "ok", "unavailable" or
// "draining"; checks maps each check's name to "ok" or its error.
type readyzBody struct {
	Status string            `json:"status"`
	Checks map[string]string `json:"checks,omitempty"`
}

func (a *adminServer) readyz(w http.ResponseWriter, r *http.Request) {
	if a.draining.Load() {
		writeReadyz(w, http.StatusServiceUnavailable, readyzBody{Status: "draining"})
		return
	}
	results, ok := a.ready(r.Context())
	if !ok {
		return // the client went away
	}
	body := readyzBody{Status: "ok", Checks: make(map[string]string, len(results))}
	code := http.StatusOK
	for _, res := range results {
		if res.err == "" {
			body.Checks[res.name] = "ok"
			continue
		}
		body.Checks[res.name] = res.err
		body.Status, code = "unavailable", http.StatusServiceUnavailable
	}
	// Shutdown may have begun while the checks ran.
	if a.draining.Load() {
		body.Status, code = "draining", http.StatusServiceUnavailable
	}
	writeReadyz(w, code, body)
}

func writeReadyz(w http.ResponseWriter, code int, body readyzBody) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// ready returns the results of a readiness evaluation: the one in
// progress if there is one, else a new one. ok is false if ctx ended first.
func (a *adminServer) ready(ctx context.Context) (results []checkResult, ok bool) {
	a.mu.Lock()
	if run := a.run; run != nil {
		run.joined++
		a.mu.Unlock()
		select {
		case <-run.done:
			return run.results, true
		case <-ctx.Done():
			return nil, false
		}
	}
	run := &readyRun{done: make(chan struct{})}
	a.run = run
	a.mu.Unlock()

	// The evaluation is bounded by the check timeout, so it finishes even
	// if this request's client goes away; other requests may be waiting.
	run.results = a.runChecks()
	a.mu.Lock()
	a.run = nil
	a.logChange(run.results)
	a.mu.Unlock()
	close(run.done)
	return run.results, true
}

// runChecks runs every check concurrently, each with the timeout. A check
// that ignores its context is reported as timed out shortly after its
// deadline and left to finish on its own.
func (a *adminServer) runChecks() []checkResult {
	type done struct {
		i   int
		err error
	}
	results := make([]checkResult, len(a.checks))
	ch := make(chan done, len(a.checks))
	for i, c := range a.checks {
		results[i].name = c.Name
		go func() {
			ctx, cancel := context.WithTimeout(a.base, a.timeout)
			defer cancel()
			ch <- done{i, runCheck(ctx, c)}
		}()
	}
	grace := time.NewTimer(a.timeout + a.timeout/2 + 100*time.Millisecond)
	defer grace.Stop()
	pending := len(a.checks)
	reported := make([]bool, len(a.checks))
	for pending > 0 {
		select {
		case d := <-ch:
			reported[d.i] = true
			pending--
			if d.err != nil {
				results[d.i].err = a.describe(d.err)
			}
		case <-grace.C:
			for i := range results {
				if !reported[i] {
					results[i].err = fmt.Sprintf("timed out after %v", a.timeout)
				}
			}
			return results
		}
	}
	return results
}

// runCheck calls c, turning a panic into an error.
func runCheck(ctx context.Context, c readyCheck) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("check panicked: %v", p)
		}
	}()
	err = c.Check(ctx)
	if err != nil && ctx.Err() != nil {
		// The check failed because its time ran out ("context deadline
		// exceeded" says less than the timeout) or the server is stopping.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return errTimedOut
		}
		return errors.New("canceled: the admin server is stopping")
	}
	return err
}

var errTimedOut = errors.New("timed out")

// describe turns a check's error into the one line /readyz shows.
func (a *adminServer) describe(err error) string {
	if errors.Is(err, errTimedOut) {
		return fmt.Sprintf("timed out after %v", a.timeout)
	}
	return oneLineRedacted(err.Error(), 300)
}

// logChange logs the readiness when it differs from the last evaluation's
// (a.mu held): a failing check once when it starts failing, and recovery.
func (a *adminServer) logChange(results []checkResult) {
	var failing []string
	for _, r := range results {
		if r.err != "" {
			failing = append(failing, r.name+": "+r.err)
		}
	}
	now := strings.Join(failing, "; ")
	if a.lastFailing != nil && *a.lastFailing == now {
		return
	}
	first := a.lastFailing == nil
	a.lastFailing = &now
	switch {
	case now != "":
		a.logger.Warn("admin: not ready", "failing", now)
	case !first:
		a.logger.Info("admin: ready again")
	}
}

// oneLineRedacted makes s one line of at most max bytes, with passwords in
// URLs and password=… parameters masked.
func oneLineRedacted(s string, max int) string {
	s = strings.Join(strings.Fields(redactSecrets(s)), " ")
	if len(s) <= max {
		return s
	}
	cut := max - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

var (
	// urlInText finds URLs in free text, up to a space or a quote.
	urlInText = regexp.MustCompile("[A-Za-z][A-Za-z0-9+.-]*://[^\\s\"'`]+")
	// secretParam finds password=… style parameters in a query string or a
	// keyword/value connection string; the value may be quoted.
	secretParam = regexp.MustCompile(`(?i)((?:^|[\s?&;,])(?:password|passwd|pwd|pass|sslpassword|secret|token|auth)\s*=\s*)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;,]*)`)
)

// redactSecrets masks the passwords of the URLs in text and every
// password=… parameter, for error text shown to operators.
func redactSecrets(text string) string {
	text = urlInText.ReplaceAllStringFunc(text, redactDSN)
	return maskSecretParams(text)
}

// maskSecretParams masks the values of password=…, pwd=…, token=… and
// similar parameters, in a query string or a keyword/value DSN.
func maskSecretParams(s string) string {
	if !strings.Contains(s, "=") {
		return s
	}
	return secretParam.ReplaceAllString(s, "${1}xxxxx")
}

// sameListenAddr reports whether listen addresses a and b would be the same
// socket: the same port (not 0) on the same host, or on any host when one
// of them is a wildcard ("", 0.0.0.0, ::). "localhost" counts as every
// loopback address.
func sameListenAddr(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil {
		return strings.EqualFold(strings.TrimSpace(a), strings.TrimSpace(b))
	}
	na, errA := net.LookupPort("tcp", pa)
	nb, errB := net.LookupPort("tcp", pb)
	if errA != nil || errB != nil {
		return strings.EqualFold(pa, pb) && strings.EqualFold(ha, hb)
	}
	if na == 0 || na != nb {
		return false
	}
	type host struct {
		ip                 netip.Addr
		wildcard, loopback bool
	}
	parse := func(h string) host {
		if h == "" {
			return host{wildcard: true}
		}
		if strings.EqualFold(h, "localhost") {
			return host{loopback: true}
		}
		ip, err := netip.ParseAddr(h)
		if err != nil {
			return host{}
		}
		ip = ip.Unmap()
		return host{ip: ip, wildcard: ip.IsUnspecified(), loopback: ip.IsLoopback()}
	}
	x, y := parse(ha), parse(hb)
	switch {
	case x.wildcard || y.wildcard:
		return true
	case x.ip.IsValid() && y.ip.IsValid():
		return x.ip == y.ip
	case x.loopback && y.loopback:
		// One of them is "localhost" (two addresses compared above).
		return true
	default:
		return strings.EqualFold(ha, hb)
	}
}

// probeScope and probeKey name the record readiness probes read. Nothing
// writes it; a Get that finds it or reports idem.ErrNotFound both prove
// that the store answers and its records table exists.
const (
	probeScope = "idem.readyz"
	probeKey   = "probe"
)

// storeReady checks that store is reachable and usable: for PostgreSQL,
// MySQL and SQLite, the store's Ping (the database answers, the schema is fully
// migrated); then, for every store, a
// Get of a reserved probe key, which must find nothing or a record, so the
// records table exists and can be read. Redis has no schema: the Get is a
// round trip to the server.
func storeReady(store idem.Store) readyCheck {
	return readyCheck{Name: "store", Check: func(ctx context.Context) error {
		switch s := store.(type) {
		case *idempgx.Store:
			if err := s.Ping(ctx); err != nil {
				return err
			}
		case *idemsqlite.Store:
			if err := s.Ping(ctx); err != nil {
				return err
			}
		case *idemmysql.Store:
			if err := s.Ping(ctx); err != nil {
				return err
			}
		}
		_, err := store.Get(ctx, probeScope, probeKey)
		if err != nil && !errors.Is(err, idem.ErrNotFound) {
			return err
		}
		return nil
	}}
}

// upstreamReady checks that a TCP connection to u's host and port (80 or
// 443 by scheme when u names none) can be opened; it sends nothing.
func upstreamReady(u *url.URL) readyCheck {
	port := u.Port()
	if port == "" {
		port = "80"
		if strings.EqualFold(u.Scheme, "https") {
			port = "443"
		}
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	return readyCheck{Name: "upstream", Check: func(ctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		_ = conn.Close()
		return nil
	}}
}
