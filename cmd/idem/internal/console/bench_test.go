package console_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// benchRecords is the size of the benchmarks' store: a million records,
// or ten thousand in bench-quick mode (-benchtime=1x), so that CI's run of
// every benchmark stays fast.
func benchRecords() int {
	if f := flag.Lookup("test.benchtime"); f != nil && f.Value.String() == "1x" {
		return 10_000
	}
	return 1_000_000
}

// BenchmarkKeySearchSQLite measures the key-search page over a SQLite store
// of benchRecords records; see benchSearch.
func BenchmarkKeySearchSQLite(b *testing.B) {
	s, err := idemsqlite.Open(b.Context(), "sqlite://"+filepath.Join(b.TempDir(), "idem.db"),
		&idemsqlite.Config{AutoMigrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	n := benchRecords()
	start := time.Now()
	if err := fillSQLite(b.Context(), s, benchScope, n); err != nil {
		b.Fatal(err)
	}
	b.Logf("filled %d records in %v", n, time.Since(start).Round(time.Millisecond))
	benchSearch(b, s, n)
}

// BenchmarkKeySearchPostgres is the same over PostgreSQL
// (IDEM_POSTGRES_URL), in a schema of its own dropped at the end.
func BenchmarkKeySearchPostgres(b *testing.B) {
	u := idemtest.ServiceURL(b, "IDEM_POSTGRES_URL")
	pool, err := pgxpool.New(b.Context(), u)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("idem_console_bench_%08x", rand.Uint32())
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			b.Error(err)
		}
	}()
	m, err := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := m.Up(b.Context()); err != nil {
		b.Fatal(err)
	}
	s, err := idempgx.New(pool, &idempgx.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	n := benchRecords()
	start := time.Now()
	if err := fillPostgres(b.Context(), pool, pgx.Identifier{schema}.Sanitize(), benchScope, n); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(b.Context(), "ANALYZE "+pgx.Identifier{schema, "idem_records"}.Sanitize()); err != nil {
		b.Fatal(err)
	}
	b.Logf("filled %d records in %v", n, time.Since(start).Round(time.Millisecond))
	benchSearch(b, s, n)
}

const benchScope = `http "acct_42" POST /v1/payments`

// benchSearch measures three searches an operator makes, each a GET of the
// key-search page through the console's handler (auth, rendering and
// all), with its p50 and p99 reported:
//
//   - exact: a key and its scope (a store Get, then the redirect);
//   - key: a key in every scope, the search of a key read in a log line
//     without its scope: a page reads at most DefaultSearchExamine records,
//     so its cost is bounded whatever the store's size;
//   - prefix: a key prefix, a first page of 50 records.
func benchSearch(b *testing.B, s idem.Store, n int) {
	srv, err := console.New(console.Config{Store: s, Token: "bench", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		query func(i int) url.Values
		want  int
	}{
		{"exact", func(i int) url.Values { return url.Values{"key": {benchKey(i)}, "scope": {benchScope}} }, http.StatusSeeOther},
		{"key", func(i int) url.Values { return url.Values{"key": {benchKey(i)}} }, http.StatusOK},
		{"prefix", func(i int) url.Values { return url.Values{"key_prefix": {benchKey(i)[:5]}} }, http.StatusOK},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			var lat []time.Duration
			for b.Loop() {
				req := httptest.NewRequest(http.MethodGet, "/keys?"+tc.query(r.IntN(n)).Encode(), nil)
				req.Header.Set("Authorization", "Bearer bench")
				w := httptest.NewRecorder()
				start := time.Now()
				srv.ServeHTTP(w, req)
				lat = append(lat, time.Since(start))
				if w.Code != tc.want {
					b.Fatalf("%s: %d\n%s", req.URL, w.Code, w.Body)
				}
				if tc.want == http.StatusOK && !strings.Contains(w.Body.String(), `id="results"`) && !strings.Contains(w.Body.String(), "Search further") {
					b.Fatalf("%s: neither results nor a search further link", req.URL)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(n), "records")
		})
	}
}

func benchKey(i int) string { return fmt.Sprintf("k%07d", i) }
