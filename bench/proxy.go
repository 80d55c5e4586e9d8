package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"

	"github.com/idem-go/idem/idemhttp"
)

// proxyScenarios is the proxy group: idem's proxy handler (what `idem
// proxy` serves, over the shared SQLite store, with its default replay
// cache) against a bare httputil.ReverseProxy, both in front of the same
// durable upstream as the HTTP group's ceiling, both with their default
// transports.
func proxyScenarios(n int) []*Scenario {
	row := func(name string, role Role, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) *Scenario {
		return &Scenario{Group: GroupProxy, Name: name, Role: role, Concurrency: HTTPClients, Messages: n, Note: note, Prepare: prep}
	}
	idem := func(replay bool) func(context.Context, *Env, *Scenario) (Run, error) {
		return func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			up, target, err := durableUpstream(ctx, env)
			if err != nil {
				return Run{}, err
			}
			e, err := sqliteStores(ctx, env)
			if err != nil {
				return Run{}, err
			}
			mw, err := idemhttp.New(e.store, &idemhttp.Config{SharedScope: true,
				Cache: &idemhttp.ReplayCache{MaxAge: idemhttp.DefaultCacheMaxAge}})
			if err != nil {
				return Run{}, err
			}
			p, err := idemhttp.NewProxy(target, mw, nil)
			if err != nil {
				return Run{}, err
			}
			return serveHTTP(env, s, p, replay, up.check), nil
		}
	}
	return []*Scenario{
		row(ProxyBare, RoleCeiling, "forwards every request; upstream "+httpDurableNote, func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			up, target, err := durableUpstream(ctx, env)
			if err != nil {
				return Run{}, err
			}
			// The transport idem proxy uses by default: as many idle
			// connections to the one upstream as net/http keeps in all.
			rp := httputil.NewSingleHostReverseProxy(target)
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConnsPerHost = tr.MaxIdleConns
			rp.Transport = tr
			return serveHTTP(env, s, rp, false, up.check), nil
		}),
		row(ProxyIdemFirst, RoleIdem, "claim + forward + complete (SQLite store)", idem(false)),
		row(ProxyIdemReplay, RoleIdem, "replayed from the replay cache, upstream not called", idem(true)),
	}
}

// durableUpstream serves a fresh durable handler on a loopback server.
func durableUpstream(ctx context.Context, env *Env) (*durableHandler, *url.URL, error) {
	d, err := newDurableHandler(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	srv := httptest.NewServer(d)
	env.Cleanup(srv.Close)
	target, err := url.Parse(srv.URL)
	return d, target, err
}
