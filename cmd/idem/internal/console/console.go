package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
)

//go:embed assets
var assets embed.FS

// Page sizes: every list takes ?limit=1..MaxPageSize, DefaultPageSize when
// it is absent.
const (
	DefaultPageSize = 50
	MaxPageSize     = 200
)

// Bounds of what one request may do or show.
const (
	// DefaultSearchExamine bounds the records one key-search page has the
	// store examine (a filter that matches few records then shows a short
	// page and "search further" instead of reading the whole store).
	DefaultSearchExamine = 50_000
	// DefaultSearchTime bounds the time one key-search page spends
	// listing (it stops after the List call that passes it).
	DefaultSearchTime = time.Second
	// DefaultOverviewExamine bounds the records the overview reads.
	DefaultOverviewExamine = 100_000
	// DefaultOverviewTime bounds the time the overview spends listing.
	DefaultOverviewTime = 2 * time.Second
	// maxShownBytes bounds a body, result or payload shown on a page.
	maxShownBytes = 64 << 10
	// maxFormBytes bounds a POST body.
	maxFormBytes = 64 << 10
	// maxParamBytes bounds one query parameter (a key is at most
	// idem.MaxKeyLen, a cursor a little more than a scope and a key).
	maxParamBytes = 4096
	// deadScan bounds the dead letters read for one page or count.
	deadScan = 1000
)

// DeadLetterQueue is one broker's dead-letter queue, as the console shows
// it. cmd/idem implements it for RabbitMQ (idemamqp).
type DeadLetterQueue interface {
	// Name names the queue for people, e.g. "RabbitMQ orders.dlq".
	Name() string
	// List reads up to limit dead letters without consuming them, their
	// bodies left out (BodyBytes says their size), and the broker's count
	// of messages in the queue.
	List(ctx context.Context, limit int) (msgs []DeadLetter, total int, err error)
	// Get reads the dead letter with message id id (looking at most at
	// limit messages), with its headers and body; an error wrapping
	// idem.ErrNotFound when there is none.
	Get(ctx context.Context, id string, limit int) (DeadLetter, error)
	// Redrive sends the dead letters with these ids back to where they were
	// first published and reports which were sent, and which were kept.
	Redrive(ctx context.Context, ids []string) (RedriveResult, error)
}

// DeadLetter is one message of a [DeadLetterQueue].
type DeadLetter struct {
	ID           string
	Reason       string
	Attempts     int
	FirstFailure time.Time
	LastFailure  time.Time
	LastError    string
	Consumer     string
	Origin       string
	Redrives     int
	Published    time.Time
	// Copies counts the messages that carry this dead letter (more than 1:
	// dead-lettered again after a redelivery).
	Copies    int
	BodyBytes int
	// Headers and Body are set by Get only; header values are already
	// rendered as bounded text.
	Headers []Header
	Body    []byte
}

// Header is one header of a message or response, as text.
type Header struct{ Name, Value string }

// RedriveResult is what [DeadLetterQueue.Redrive] did.
type RedriveResult struct {
	Redriven, Capped, Dropped, Missing []string
}

// Config is what the console serves.
type Config struct {
	// Store is the idem store; it must be set. When it implements
	// idem.Lister, the key search lists; otherwise it only looks up a key
	// in a scope.
	Store idem.Store
	// StoreName names the store on the pages (a DSN without its password).
	StoreName string
	// Inbox is the store's inbox; nil hides the inbox pages.
	Inbox inbox.Admin
	// DeadLetters are the dead-letter queues shown, in this order.
	DeadLetters []DeadLetterQueue
	// Token, when set, is required of every request (bearer or the login
	// form's cookie).
	Token string
	// ReadOnly refuses every action (redrive, discard).
	ReadOnly bool
	// Logger receives a line for every action and every refusal. Default
	// slog.Default().
	Logger *slog.Logger
	// SearchExamine and OverviewExamine bound the records one search page
	// and one overview read. Defaults DefaultSearchExamine and
	// DefaultOverviewExamine.
	SearchExamine, OverviewExamine int
	// SearchTime and OverviewTime bound the time one search page and one
	// overview spend listing. Defaults DefaultSearchTime and
	// DefaultOverviewTime.
	SearchTime, OverviewTime time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Server is the console's http.Handler.
type Server struct {
	cfg    Config
	lister idem.Lister
	log    *slog.Logger
	pages  map[string]*template.Template
	mux    *http.ServeMux
}

// New checks cfg and returns the console.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("console: no store")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SearchExamine <= 0 {
		cfg.SearchExamine = DefaultSearchExamine
	}
	if cfg.SearchTime <= 0 {
		cfg.SearchTime = DefaultSearchTime
	}
	if cfg.OverviewTime <= 0 {
		cfg.OverviewTime = DefaultOverviewTime
	}
	if cfg.OverviewExamine <= 0 {
		cfg.OverviewExamine = DefaultOverviewExamine
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	s.lister, _ = cfg.Store.(idem.Lister)
	if err := s.parsePages(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /login", s.loginPage)
	s.mux.HandleFunc("POST /login", s.login)
	s.mux.HandleFunc("POST /logout", s.logout)
	s.mux.HandleFunc("GET /{$}", s.overview)
	s.mux.HandleFunc("GET /keys", s.keys)
	s.mux.HandleFunc("GET /keys/record", s.record)
	s.mux.HandleFunc("GET /inbox", s.inboxList)
	s.mux.HandleFunc("GET /inbox/row", s.inboxRow)
	s.mux.HandleFunc("POST /inbox/redrive", s.inboxRedrive)
	s.mux.HandleFunc("POST /inbox/discard", s.inboxDiscard)
	s.mux.HandleFunc("GET /dlq", s.dlqIndex)
	s.mux.HandleFunc("GET /dlq/list", s.dlqList)
	s.mux.HandleFunc("GET /dlq/message", s.dlqMessage)
	s.mux.HandleFunc("POST /dlq/redrive", s.dlqRedrive)
	return s, nil
}

// CheckListen refuses to serve addr without a token unless it is a
// loopback address: the console can redrive and discard messages.
func CheckListen(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("console: --listen %q: want HOST:PORT, e.g. 127.0.0.1:8090", addr)
	}
	if token != "" {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("console: refusing to listen on %s without a token: anyone who reaches it could redrive and discard messages; set --token (or IDEM_CONSOLE_TOKEN), or listen on 127.0.0.1", addr)
}

// ServeHTTP serves the console: security headers on every response, then
// authentication, then CSRF and read-only checks on POSTs.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: with no-referrer a browser sends
	// "Origin: null" on the console's own form posts.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if len(r.URL.RawQuery) > 4*maxParamBytes {
		s.fail(w, r, http.StatusRequestURITooLong, "the query string is too long")
		return
	}
	r = s.withCSRF(w, r)
	static := strings.HasPrefix(r.URL.Path, "/static/")
	login := r.URL.Path == "/login"
	if !static && !login && !s.authenticated(r) {
		if r.Header.Get("Authorization") != "" || r.Method != http.MethodGet {
			s.log.Warn("console: refused", "why", "not authenticated", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
		s.render(w, r, http.StatusUnauthorized, "login", loginData{Next: safeNext(r.URL.RequestURI())})
		return
	}
	if r.Method == http.MethodPost {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			s.fail(w, r, http.StatusBadRequest, "unreadable form: "+err.Error())
			return
		}
		// Read-only first: it refuses every action whatever the form holds.
		if s.cfg.ReadOnly && !login && r.URL.Path != "/logout" {
			s.log.Warn("console: refused", "why", "read-only", "path", r.URL.Path, "who", s.who(r), "remote", r.RemoteAddr)
			s.fail(w, r, http.StatusForbidden, "this console is read-only (--read-only): no action is allowed")
			return
		}
		if why := s.checkCSRF(r); why != "" {
			s.log.Warn("console: refused", "why", why, "path", r.URL.Path, "who", s.who(r), "remote", r.RemoteAddr)
			s.fail(w, r, http.StatusForbidden, "refused: "+why+"; reload the page and try again")
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// logAction logs an action with who did it.
func (s *Server) logAction(r *http.Request, action string, attrs ...any) {
	s.log.Info("console: action", append([]any{"action", action, "who", s.who(r), "remote", r.RemoteAddr}, attrs...)...)
}

// errBadParam is a query or form parameter that is out of its bounds.
type errBadParam struct{ msg string }

func (e errBadParam) Error() string { return e.msg }

func badParam(format string, args ...any) error { return errBadParam{fmt.Sprintf(format, args...)} }

// param returns the query parameter name, bounded.
func param(r *http.Request, name string) (string, error) {
	v := r.URL.Query().Get(name)
	if len(v) > maxParamBytes {
		return "", badParam("%s is longer than %d bytes", name, maxParamBytes)
	}
	return v, nil
}

// pageSize reads ?limit=, 1..MaxPageSize, DefaultPageSize when absent.
func pageSize(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return DefaultPageSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxPageSize {
		return 0, badParam("limit must be a number from 1 to %d, got %q", MaxPageSize, cut(v, 32))
	}
	return n, nil
}

// fail renders an error page with status code.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	s.render(w, r, code, "error", errorData{Status: code, StatusText: http.StatusText(code), Message: msg})
}

// failErr renders err: a bad parameter is a 400, anything else a 500
// (logged, since the operator may not see the page).
func (s *Server) failErr(w http.ResponseWriter, r *http.Request, what string, err error) {
	var bad errBadParam
	var code int
	switch {
	case errors.As(err, &bad), errors.Is(err, idem.ErrInvalidConfig), errors.Is(err, idem.ErrInvalidKey):
		code = http.StatusBadRequest
	case errors.Is(err, idem.ErrNotFound):
		code = http.StatusNotFound
	default:
		code = http.StatusInternalServerError
		s.log.Error("console: "+what, "err", err, "path", r.URL.Path, "who", s.who(r))
	}
	msg := strings.TrimPrefix(err.Error(), idem.ErrInvalidConfig.Error()+": ")
	s.fail(w, r, code, what+": "+cut(msg, 1000))
}

// cut bounds s to n bytes on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utfStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utfStart(b byte) bool { return b&0xC0 != 0x80 }
