package idempgx

import (
	"context"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestCopyLookupPlannedPerCall: a store whose lookup is planned on every
// call (planLookup, which a pgx batch cannot carry) still looks its keys
// up before copying. BenchmarkLookupAB's old arm is such a store.
func TestCopyLookupPlannedPerCall(t *testing.T) {
	url := idemtest.ServiceURL(t, "IDEM_POSTGRES_URL")
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := "idemtest_copyplan_" + fmt.Sprint(idem.FingerprintBytes([]byte(t.Name()))[0])
	_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	m, err := NewMigrator(pool, &MigratorConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, &Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	s.q.planLookup = true
	msgs := make([]idem.Message, 100)
	for i := range msgs {
		k := fmt.Sprintf("k%03d", i)
		msgs[i] = idem.Message{Key: k, Fingerprint: idem.FingerprintBytes([]byte(k))}
	}
	none := func(context.Context, pgx.Tx, []int) error { return nil }
	if _, err := s.ProcessBatch(ctx, msgs[:50], none); err != nil {
		t.Fatal(err)
	}
	s.copy.seen.Store(copySeenMax)
	res, err := s.ProcessBatch(ctx, msgs, none)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want := idem.Processed
		if i < 50 {
			want = idem.Duplicate
		}
		if r != want {
			t.Fatalf("message %d: %v, want %v", i, r, want)
		}
	}
}
