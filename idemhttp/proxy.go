package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/idem-go/idem"
)

// ProxyConfig configures [NewProxy]. A nil *ProxyConfig means the defaults.
type ProxyConfig struct {
	// Transport carries requests to the upstream. Default: a clone of
	// http.DefaultTransport with ResponseHeaderTimeout set to Timeout.
	Transport http.RoundTripper
	// Timeout bounds the wait for the upstream's response headers; past it
	// the client gets 504 and the key is released. Zero means no bound.
	// Ignored when Transport is set.
	Timeout time.Duration
	// Logger receives upstream errors. Default slog.Default().
	Logger *slog.Logger
}

// NewProxy returns a reverse proxy to upstream with mw applied to every
// request. The client's Idempotency-Key header reaches the upstream
// unchanged, so an idempotent upstream can deduplicate as well; a
// client-supplied Idempotent-Replayed header is stripped so the upstream
// cannot be misled. Hop-by-hop headers are removed in both directions and
// X-Forwarded-* headers are set. If the upstream cannot be reached the
// client gets 502 (504 on a timeout) as problem+json and the key is
// released, so a retry is forwarded again.
func NewProxy(upstream *url.URL, mw *Middleware, cfg *ProxyConfig) (http.Handler, error) {
	if upstream == nil || upstream.Scheme == "" || upstream.Host == "" {
		return nil, fmt.Errorf("idemhttp: %w: upstream must be an absolute URL", idem.ErrInvalidConfig)
	}
	if mw == nil {
		return nil, fmt.Errorf("idemhttp: %w: nil middleware", idem.ErrInvalidConfig)
	}
	var c ProxyConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.ResponseHeaderTimeout = c.Timeout
		c.Transport = t
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.SetXForwarded()
			pr.Out.Header.Del(ReplayedHeader)
		},
		Transport: c.Transport,
		// FlushInterval stays 0: ReverseProxy still flushes event streams
		// and responses of unknown length at once, and every other
		// response is recorded before the client sees it.
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// Whatever the storage policy, a failed forward must not be replayed.
			Release(w)
			p := newProblem(http.StatusBadGateway, TypeUpstreamUnreachable, "Upstream unreachable", nil)
			var ne net.Error
			if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
				p = newProblem(http.StatusGatewayTimeout, TypeUpstreamTimeout, "Upstream timed out", nil)
			}
			p.Detail = "the request could not be forwarded; it was not recorded and may be retried"
			p.Err = err
			c.Logger.Warn("idemhttp: upstream request failed", "upstream", upstream.Redacted(), "err", err)
			mw.errorFunc(w, r, p)
		},
	}
	return mw.Handler(rp), nil
}
