package main

import (
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem/store/idempgx"
)

// withQuery returns dsn with the query parameter name set to value.
func withQuery(t *testing.T, dsn, name, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestPostgresStorePoolSize: the store the commands open (idem proxy's
// among them) gets a pool sized for concurrent requests, the migrator a
// small one, and a pool_max_conns in the DSN wins over both, also when it
// is smaller. A one-shot command still opens a single connection.
func TestPostgresStorePoolSize(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	schema := testSchema(t, url)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", url, "--schema", schema), exitOK)

	for _, tc := range []struct {
		name, dsn            string
		wantMax, wantHolders int
		wantMigratorMaxConns int32
	}{
		{"default", url, pgStoreMaxConns, pgStoreMaxConns / 4, pgMigratorMaxConns},
		{"dsn", withQuery(t, url, "pool_max_conns", "20"), 20, 5, 20},
		{"dsn smaller", withQuery(t, url, "pool_max_conns", "3"), 3, 1, 3},
		{"dsn single", withQuery(t, url, "pool_max_conns", "1"), 1, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := storeConfig{DSN: tc.dsn, Schema: schema}
			s, closeStore, err := postgresBackend.open(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer closeStore()
			ps := s.(*idempgx.Store)
			st := ps.ConnStats()
			if got := ps.Pool().Config().MaxConns; int(got) != tc.wantMax || st.MaxConns != tc.wantMax || st.HolderConns != tc.wantHolders {
				t.Fatalf("store pool MaxConns = %d, stats %+v; want %d connections, %d kept for lease holders", got, st, tc.wantMax, tc.wantHolders)
			}
			// What idem keys get does: Check at open, then one read.
			if _, err := s.Get(t.Context(), "", "absent"); err == nil {
				t.Fatal("Get of an absent key succeeded")
			}
			if n := ps.Pool().Stat().TotalConns(); n != 1 {
				t.Errorf("a one-shot command opened %d connections, want 1", n)
			}

			pool, err := openPool(t.Context(), cfg, pgMigratorMaxConns)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if got := pool.Config().MaxConns; got != tc.wantMigratorMaxConns {
				t.Errorf("migrator pool MaxConns = %d, want %d", got, tc.wantMigratorMaxConns)
			}
		})
	}
}

// TestPostgresBadPoolSize: a pool_max_conns pgx refuses is reported with
// what is wrong with it, before any connection, and without the password.
func TestPostgresBadPoolSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ value, want string }{
		{"abc", `cannot parse pool_max_conns (strconv.ParseInt: parsing "abc": invalid syntax)`},
		{"0", "pool_max_conns too small"},
		{"-2", "pool_max_conns too small"},
	} {
		dsn := "postgres://idem:s3cr%60t@127.0.0.1:1/x?pool_max_conns=" + tc.value
		for _, args := range [][]string{{"keys", "get", "k"}, {"migrate", "up"}} {
			t.Run(tc.value+"/"+args[0], func(t *testing.T) {
				t.Parallel()
				r := runCLI(t, nil, append(args, "--store", dsn)...)
				wantExit(t, r, exitFailure, "invalid --store", tc.want)
				if strings.Contains(r.Stderr, "s3cr") || strings.Count(r.Stderr, "127.0.0.1") != 1 {
					t.Fatalf("password or DSN echoed: %s", r.Stderr)
				}
			})
		}
	}
}

func TestPostgresSetsPoolMaxConns(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]bool{
		"postgres://u@h/db":                                      false,
		"postgres://u@h/db?sslmode=disable":                      false,
		"postgres://u@h/db?pool_max_conns=20":                    true,
		"postgres://u@h/db?sslmode=disable&pool_max_conns=2":     true,
		"postgres://u@h/db?pool_min_conns=2":                     false,
		"postgres://u:pool_max_conns@h/db":                       false,
		"host=h user=u dbname=db pool_max_conns=5":               true,
		"postgres://u@h/db?application_name=pool_max_conns%3D20": false,
	} {
		if got := setsPoolMaxConns(dsn); got != want {
			t.Errorf("setsPoolMaxConns(%q) = %v, want %v", dsn, got, want)
		}
	}
}
