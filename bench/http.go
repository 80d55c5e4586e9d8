package bench

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/store/idemsqlite"
)

// HTTPClients is how many keep-alive clients load the server.
const HTTPClients = 16

// Row names of the HTTP and proxy groups that the headline ratios use.
const (
	HTTPBare          = "bare handler"
	HTTPDurableBare   = "durable bare handler (one fsync'd SQLite row)"
	HTTPDurableFirst  = "idem middleware + durable handler, first execution"
	HTTPReplay        = "idem middleware, replay (replay cache)"
	HTTPReplayNoCache = "idem middleware, replay, no cache"
	ProxyBare         = "bare httputil.ReverseProxy"
	ProxyIdemFirst    = "idem proxy, first execution"
	ProxyIdemReplay   = "idem proxy, replay"
	httpDurableNote   = "handler commits one row per request (synchronous=FULL)"
	// httpReplayCacheAge is the replay row's cache max age, the longest
	// idemhttp allows: the row measures replays from the cache, and with
	// the default 5 s the first keys' entries aged out before their replay
	// on a loaded machine (the untimed first executions alone took 4 s),
	// so the row measured cache misses.
	httpReplayCacheAge = time.Minute
)

func httpScenarios(n int) []*Scenario {
	row := func(name string, role Role, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) *Scenario {
		return &Scenario{Group: GroupHTTP, Name: name, Role: role, Concurrency: HTTPClients, Messages: n, Note: note, Prepare: prep}
	}
	mw := func(replay bool, cache *idemhttp.ReplayCache) func(context.Context, *Env, *Scenario) (Run, error) {
		return func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			h, err := guarded(ctx, env, http.HandlerFunc(payment), cache)
			if err != nil {
				return Run{}, err
			}
			run := serveHTTP(env, s, h, replay, nil)
			if replay {
				run = passes(run, fastPasses)
			}
			return run, nil
		}
	}
	return []*Scenario{
		row(HTTPBare, RoleCeiling, "no Idempotency-Key handling, no durable effect", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			return passes(serveHTTP(env, s, http.HandlerFunc(payment), false, nil), fastPasses), nil
		}),
		row(HTTPDurableBare, RoleCeiling, httpDurableNote+", no Idempotency-Key handling", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			d, err := newDurableHandler(ctx, env)
			if err != nil {
				return Run{}, err
			}
			return serveHTTP(env, s, d, false, d.check), nil
		}),
		row("idem middleware, first execution", RoleIdem, "claim + run + store response (fsync'd), handler has no durable effect", mw(false, nil)),
		row(HTTPDurableFirst, RoleIdem, "claim + the durable handler + complete; claims and completions group-committed", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			d, err := newDurableHandler(ctx, env)
			if err != nil {
				return Run{}, err
			}
			h, err := guarded(ctx, env, d, nil)
			if err != nil {
				return Run{}, err
			}
			return serveHTTP(env, s, h, false, d.check), nil
		}),
		row(HTTPReplay, RoleIdem, fmt.Sprintf("stored response replayed from the replay cache (max age %v), handler not run", httpReplayCacheAge),
			mw(true, &idemhttp.ReplayCache{MaxAge: httpReplayCacheAge})),
		row(HTTPReplayNoCache, RoleIdem, "stored response read from SQLite and replayed, handler not run", mw(true, nil)),
	}
}

// fastPasses is how many times the rows that write nothing per request
// (the bare handler and the replays) send their stream in one timed run:
// one pass of 2,000 requests lasts about 0.06 s at their rates, too short
// to time on a shared machine (their spread reached 2×). Each pass of a
// replay row replays every key again.
const fastPasses = 5

// passes makes run's timed part n passes over its stream.
func passes(run Run, n int) Run {
	exec := run.Exec
	run.Rate = func(ctx context.Context, st Stream) (float64, error) {
		start := time.Now()
		for range n {
			if err := exec(ctx, st); err != nil {
				return 0, err
			}
		}
		return float64(n*len(st.Keys)) / time.Since(start).Seconds(), nil
	}
	return run
}

// payment is the handler under test: a small JSON 201.
func payment(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":"pay_1","status":"succeeded"}`))
}

// guarded wraps h in the middleware over the shared SQLite store.
func guarded(ctx context.Context, env *Env, h http.Handler, cache *idemhttp.ReplayCache) (http.Handler, error) {
	e, err := sqliteStores(ctx, env)
	if err != nil {
		return nil, err
	}
	mw, err := idemhttp.New(e.store, &idemhttp.Config{SharedScope: true, Cache: cache})
	if err != nil {
		return nil, err
	}
	return mw.Handler(h), nil
}

// durableHandler is payment with a durable effect: it commits one row,
// keyed by the request's Idempotency-Key, to its own SQLite file (WAL,
// synchronous=FULL) before it answers, the way a careful hand-written
// handler records a payment. Its rows are counted after each run.
type durableHandler struct {
	db    *sql.DB
	table string
	want  int
}

func newDurableHandler(ctx context.Context, env *Env) (*durableHandler, error) {
	db, err := sharedValue(env, "http-durable", func() (*sql.DB, error) {
		db, err := idemsqlite.OpenDB(ctx, filepath.Join(env.Dir, "payments.db"))
		if err != nil {
			return nil, err
		}
		env.Cleanup(func() { _ = db.Close() })
		// One writer connection, as careful hand-written SQLite code has.
		db.SetMaxOpenConns(1)
		return db, nil
	})
	if err != nil {
		return nil, err
	}
	env.streams++ // a unique table name per handler
	d := &durableHandler{db: db, table: fmt.Sprintf("payments_%d", env.streams)}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+d.table+" (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *durableHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		key = r.Header.Get("idempotency-key") // as the idem proxy forwards it
	}
	if _, err := d.db.ExecContext(r.Context(), "INSERT INTO "+d.table+" (id, amount) VALUES (?, 100)", key); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":"pay_1","status":"succeeded"}`))
}

// check asserts one row per distinct key so far: exactly once.
func (d *durableHandler) check(ctx context.Context, st Stream) error {
	d.want += st.Distinct
	var n int
	if err := d.db.QueryRowContext(ctx, "SELECT count(*) FROM "+d.table).Scan(&n); err != nil {
		return err
	}
	if n != d.want {
		return fmt.Errorf("%d payments recorded, want %d (one per distinct key)", n, d.want)
	}
	return nil
}

// serveHTTP serves h on a loopback server and returns a run that POSTs
// every key of the stream from HTTPClients keep-alive clients. With
// replay, the keys' first executions run first, untimed. check, if set,
// runs after each run.
func serveHTTP(env *Env, s *Scenario, h http.Handler, replay bool, check func(context.Context, Stream) error) Run {
	srv := httptest.NewServer(h)
	env.Cleanup(srv.Close)
	return clientRun(env, s, srv.URL, replay, check)
}

// clientRun is serveHTTP's client side, for a server at base.
func clientRun(env *Env, s *Scenario, base string, replay bool, check func(context.Context, Stream) error) Run {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: HTTPClients, MaxIdleConnsPerHost: HTTPClients}}
	env.Cleanup(client.CloseIdleConnections)
	body := []byte(`{"amount":100,"currency":"EUR"}`)
	post := func(ctx context.Context, key string, wantReplay bool) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", strconv.Quote(key))
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("POST key %q: status %d, want 201", key, resp.StatusCode)
		}
		if wantReplay && resp.Header.Get(idemhttp.ReplayedHeader) != "true" {
			return fmt.Errorf("POST key %q: not a replay", key)
		}
		return nil
	}
	all := func(wantReplay bool) func(ctx context.Context, st Stream) error {
		return func(ctx context.Context, st Stream) error {
			return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, _, i int) error {
				return post(ctx, st.Keys[i], wantReplay)
			})
		}
	}
	run := Run{Exec: all(replay), After: check}
	if replay {
		run.Before = all(false) // the first executions, untimed
	}
	return run
}
