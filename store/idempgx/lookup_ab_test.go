package idempgx

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// oldLookup is processLookup before it became a cached lateral probe.
const oldLookup = `SELECT r.scope, r.key, r.state, r.fingerprint,
	coalesce(r.lease_expires_at > now(), false), r.expires_at <= now()
FROM %s AS r JOIN unnest($1::text[], $2::text[]) AS u(scope, key) ON r.scope = u.scope AND r.key = u.key`

// BenchmarkLookupAB times ProcessBatch with 30 % duplicates on two stores
// over tables of 200,000 records, one with the lookup of conflicted keys
// as it was (a join planned on every call), one with the cached lateral
// lookup, alternating batches so that the load of a shared machine falls
// on both alike; b.N batches per arm. It reports each arm's median and
// their ratio (new/old). Every call fills two tables, so give it a fixed
// count (AB_SIZE: batch size, default 100):
//
//	go test -run '^$' -bench LookupAB -benchtime 200x .
func BenchmarkLookupAB(b *testing.B) {
	url := os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		b.Skip("set IDEM_POSTGRES_URL")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	size := 100
	fmt.Sscan(os.Getenv("AB_SIZE"), &size)
	type arm struct {
		name   string
		s      *Store
		old    bool
		next   int
		times  []float64
		schema string
	}
	var arms []*arm
	for _, a := range []struct {
		name string
		old  bool
	}{{"old: join, planned per call", true}, {"new: lateral, cached", false}} {
		schema := fmt.Sprintf("ab_%d_%v", time.Now().UnixNano()%1e6, a.old)
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			b.Fatal(err)
		}
		defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		m, err := NewMigrator(pool, &MigratorConfig{Schema: schema})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.Up(ctx); err != nil {
			b.Fatal(err)
		}
		// NoCopy: both arms on the INSERT path, whose lookup this compares.
		s, err := New(pool, &Config{Schema: schema, NoCopy: true})
		if err != nil {
			b.Fatal(err)
		}
		if a.old {
			s.q.processLookup = fmt.Sprintf(oldLookup, pgx.Identifier{schema, "idem_records"}.Sanitize())
			s.q.planLookup = true
		}
		if _, err := pool.Exec(ctx, "INSERT INTO "+schema+".idem_records (scope, key, state, fingerprint, completed_at, expires_at) SELECT 'pg-batch', 'pre-' || g, 'completed', sha256(g::text::bytea), now(), now() + interval '1 day' FROM generate_series(1, 200000) g"); err != nil {
			b.Fatal(err)
		}
		pool.Exec(ctx, "ANALYZE "+schema+".idem_records")
		arms = append(arms, &arm{name: a.name, s: s, old: a.old, schema: schema})
	}
	batch := func(a *arm) []idem.Message {
		msgs := make([]idem.Message, size)
		for i := range msgs {
			var k string
			if i%10 < 3 && a.next > 0 {
				k = fmt.Sprintf("k-%09d", (a.next*7919+i)%a.next)
			} else {
				a.next++
				k = fmt.Sprintf("k-%09d", a.next)
			}
			msgs[i] = idem.Message{Scope: "pg-batch", Key: k, Fingerprint: sha256.Sum256([]byte(k))}
		}
		return msgs
	}
	run := func(a *arm) {
		msgs := batch(a)
		t0 := time.Now()
		_, err := a.s.ProcessBatch(ctx, msgs, func(ctx context.Context, tx pgx.Tx, fresh []int) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
		a.times = append(a.times, float64(time.Since(t0).Microseconds()))
	}
	for _, a := range arms {
		for range 10 {
			run(a)
		}
		a.times = nil
	}
	b.ResetTimer()
	for r := range b.N {
		for i := range arms {
			run(arms[(i+r)%len(arms)])
		}
	}
	b.StopTimer()
	medians := make([]float64, len(arms))
	for i, a := range arms {
		sort.Float64s(a.times)
		medians[i] = a.times[len(a.times)/2]
		b.Logf("size %d: %-30s median %8.0f µs/batch  p25 %8.0f  p75 %8.0f", size, a.name, medians[i], a.times[len(a.times)/4], a.times[3*len(a.times)/4])
	}
	b.ReportMetric(medians[0], "old-µs/batch")
	b.ReportMetric(medians[1], "new-µs/batch")
	b.ReportMetric(medians[1]/medians[0], "new/old")
}
