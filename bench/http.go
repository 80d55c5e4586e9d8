package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"

	"github.com/idem-go/idem/idemhttp"
)

// HTTPClients is how many keep-alive clients load the server.
const HTTPClients = 16

func httpScenarios(n int) []*Scenario {
	row := func(name string, role Role, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) *Scenario {
		return &Scenario{Group: GroupHTTP, Name: name, Role: role, Concurrency: HTTPClients, Messages: n, Note: note, Prepare: prep}
	}
	return []*Scenario{
		row("bare handler", RoleCeiling, "no Idempotency-Key handling", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			return prepHTTP(ctx, env, s, false, false)
		}),
		row("idem middleware, first execution", RoleIdem, "claim + run + store response (fsync'd)", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			return prepHTTP(ctx, env, s, true, false)
		}),
		row("idem middleware, replay", RoleIdem, "stored response replayed, handler not run", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
			return prepHTTP(ctx, env, s, true, true)
		}),
	}
}

// payment is the handler under test: a small JSON 201.
func payment(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":"pay_1","status":"succeeded"}`))
}

func prepHTTP(ctx context.Context, env *Env, s *Scenario, guarded, replay bool) (Run, error) {
	var h http.Handler = http.HandlerFunc(payment)
	if guarded {
		e, err := sqliteStores(ctx, env)
		if err != nil {
			return Run{}, err
		}
		mw, err := idemhttp.New(e.store, &idemhttp.Config{SharedScope: true})
		if err != nil {
			return Run{}, err
		}
		h = mw.Handler(h)
	}
	srv := httptest.NewServer(h)
	env.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: HTTPClients, MaxIdleConnsPerHost: HTTPClients}}
	env.Cleanup(client.CloseIdleConnections)
	body := []byte(`{"amount":100,"currency":"EUR"}`)
	post := func(ctx context.Context, key string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", bytes.NewReader(body))
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
		return nil
	}
	all := func(ctx context.Context, st Stream) error {
		return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, _, i int) error {
			return post(ctx, st.Keys[i])
		})
	}
	run := Run{Exec: all}
	if replay {
		run.Before = all // the first executions, untimed
	}
	return run, nil
}
