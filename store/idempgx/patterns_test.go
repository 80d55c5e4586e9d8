package idempgx_test

// The idempotent-write patterns that need no dedupe record (docs/patterns.md,
// patterns 5 and 6), proved against the real server under duplicate storms,
// and the delta trap they avoid.

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// storm delivers each of n events copies times, shuffled, from workers
// goroutines, and returns how many deliveries deliver reported as applied.
func storm(t *testing.T, n, copies, workers int, deliver func(ctx context.Context, event int) (bool, error)) int {
	t.Helper()
	order := make([]int, 0, n*copies)
	for e := range n {
		for range copies {
			order = append(order, e)
		}
	}
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var (
		mu      sync.Mutex
		applied int
		next    int
		wg      sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				if next == len(order) {
					mu.Unlock()
					return
				}
				e := order[next]
				next++
				mu.Unlock()
				ok, err := deliver(context.Background(), e)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					applied++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return applied
}

// Pattern 5, conditional versioned write: an event carries the version it
// brings the row to, and the update only moves forward. Replays and late
// (older) events touch 0 rows and are correctly ignored, in any order and
// from any number of consumers at once.
func TestPatternVersionedWrite(t *testing.T) {
	t.Parallel()
	pool, schema := testPool(t), newSchema(t)
	ctx := context.Background()
	orders := pgx.Identifier{schema, "orders"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id int PRIMARY KEY, status text NOT NULL, version int NOT NULL); INSERT INTO "+orders+" VALUES (1, 'created', 0)"); err != nil {
		t.Fatal(err)
	}
	statuses := []string{"paid", "packed", "shipped", "delivered", "closed"}
	apply := func(ctx context.Context, e int) (bool, error) {
		tag, err := pool.Exec(ctx, "UPDATE "+orders+" SET status = $1, version = $2 WHERE id = 1 AND version < $2", statuses[e], e+1)
		return tag.RowsAffected() == 1, err
	}
	applied := storm(t, len(statuses), 10, 16, apply)
	var status string
	var version int
	if err := pool.QueryRow(ctx, "SELECT status, version FROM "+orders+" WHERE id = 1").Scan(&status, &version); err != nil {
		t.Fatal(err)
	}
	if status != "closed" || version != 5 {
		t.Fatalf("order after 50 shuffled deliveries of 5 events: %s v%d, want closed v5", status, version)
	}
	if applied < 1 || applied > len(statuses) {
		t.Fatalf("%d deliveries applied, want between 1 and %d (each version at most once)", applied, len(statuses))
	}
	// A replay of the last event, and a late first one, touch nothing.
	for _, e := range []int{4, 0} {
		if ok, err := apply(ctx, e); err != nil || ok {
			t.Fatalf("event %d delivered again: applied=%v, %v; want 0 rows", e, ok, err)
		}
	}
}

// Pattern 6, natural-key upsert and state targets: the effect names its
// own identity (one shipment per order) or sets an absolute state, so
// doing it twice is doing it once.
func TestPatternNaturalKeyAndStateTarget(t *testing.T) {
	t.Parallel()
	pool, schema := testPool(t), newSchema(t)
	ctx := context.Background()
	shipments := pgx.Identifier{schema, "shipments"}.Sanitize()
	stock := pgx.Identifier{schema, "stock"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+shipments+" (order_id int PRIMARY KEY, carrier text NOT NULL);"+
		"CREATE TABLE "+stock+" (sku text PRIMARY KEY, qty_total int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	created := storm(t, 20, 10, 16, func(ctx context.Context, order int) (bool, error) {
		tag, err := pool.Exec(ctx, "INSERT INTO "+shipments+" (order_id, carrier) VALUES ($1, 'dhl') ON CONFLICT (order_id) DO NOTHING", order)
		return tag.RowsAffected() == 1, err
	})
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+shipments).Scan(&n); err != nil || n != 20 || created != 20 {
		t.Fatalf("200 deliveries of 20 ship events: %d rows, %d inserts (%v); want 20 and 20", n, created, err)
	}
	// "qty_total: 15", an absolute state, delivered ten times at once.
	storm(t, 1, 10, 10, func(ctx context.Context, _ int) (bool, error) {
		_, err := pool.Exec(ctx, "INSERT INTO "+stock+" (sku, qty_total) VALUES ('sku-1', 15) ON CONFLICT (sku) DO UPDATE SET qty_total = EXCLUDED.qty_total")
		return true, err
	})
	var qty int
	if err := pool.QueryRow(ctx, "SELECT qty_total FROM "+stock+" WHERE sku = 'sku-1'").Scan(&qty); err != nil || qty != 15 {
		t.Fatalf("state target delivered 10 times: qty %d (%v), want 15", qty, err)
	}
}

// The delta trap: "delta_qty: +5" delivered twice is applied twice. The
// same delta through Process, with its dedupe record in the effect's
// transaction, is applied once.
func TestPatternDeltaTrap(t *testing.T) {
	t.Parallel()
	pool, schema := testPool(t), migratedSchema(t)
	ctx := context.Background()
	stock := pgx.Identifier{schema, "stock"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+stock+" (sku text PRIMARY KEY, qty int NOT NULL); INSERT INTO "+stock+" VALUES ('naive', 10), ('idem', 10)"); err != nil {
		t.Fatal(err)
	}
	store, err := idempgx.New(pool, &idempgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	storm(t, 1, 8, 8, func(ctx context.Context, _ int) (bool, error) {
		_, err := pool.Exec(ctx, "UPDATE "+stock+" SET qty = qty + 5 WHERE sku = 'naive'")
		return true, err
	})
	storm(t, 1, 8, 8, func(ctx context.Context, _ int) (bool, error) {
		msg := idem.Message{Scope: "inventory", Key: "restock-1", Fingerprint: idem.FingerprintBytes([]byte(`{"delta_qty":5}`))}
		res, err := store.Process(ctx, msg, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE "+stock+" SET qty = qty + 5 WHERE sku = 'idem'")
			return err
		})
		return res == idem.Processed, err
	})
	got := map[string]int{}
	rows, err := pool.Query(ctx, "SELECT sku, qty FROM "+stock)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var sku string
		var qty int
		if err := rows.Scan(&sku, &qty); err != nil {
			t.Fatal(err)
		}
		got[sku] = qty
	}
	if got["naive"] != 10+8*5 || got["idem"] != 15 {
		t.Fatalf("after 8 deliveries of +5: %v; want naive %d (the trap) and idem 15", got, 10+8*5)
	}
}
