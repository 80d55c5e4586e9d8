package idempgx_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestProcessLookupGenericPlan checks that the generic plan of ProcessBatch's
// lookup, the one PostgreSQL caches with the prepared statement, probes the
// primary key rather than scanning the table: on a new, empty table (where a
// join's generic plan is a hash join over a sequential scan, kept as the
// table grows) and on a grown, analyzed one. The partitioned layout plans
// the lookup on every call; its custom plan is checked on a grown table.
func TestProcessLookupGenericPlan(t *testing.T) {
	for _, layout := range []struct {
		name  string
		store func(testing.TB) *idempgx.Store
	}{
		{"plain", func(tb testing.TB) *idempgx.Store { return newStore(tb, nil) }},
		{"partitioned", func(tb testing.TB) *idempgx.Store { return newPartitionedStore(tb, nil) }},
	} {
		t.Run(layout.name, func(t *testing.T) {
			s := layout.store(t)
			ctx := ctxT(t)
			partitioned := s.Config().Partitioned
			if !partitioned {
				assertIndexPlan(t, ctx, s, "generic", "empty table")
			}
			msgs := make([]idem.Message, 10000)
			for i := range msgs {
				msgs[i] = idem.Message{Scope: "s", Key: fmt.Sprint("k", i), Fingerprint: fp("v")}
			}
			for range 2 {
				if _, err := s.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []int) error { return nil }); err != nil {
					t.Fatal(err)
				}
				for i := range msgs {
					msgs[i].Key += "+"
				}
			}
			if _, err := testPool(t).Exec(ctx, "ANALYZE "+qualified(s, "idem_records")); err != nil {
				t.Fatal(err)
			}
			mode := "generic"
			if partitioned {
				mode = "custom"
			}
			assertIndexPlan(t, ctx, s, mode, "20,000 rows")
		})
	}
}

// assertIndexPlan explains the lookup's plan (mode: generic or custom)
// and fails unless it probes the primary key of the relation that holds
// the records (an empty partition may be scanned: it has no pages).
func assertIndexPlan(t *testing.T, ctx context.Context, s *idempgx.Store, mode, when string) {
	t.Helper()
	plan := explainPlan(t, ctx, s, mode, idempgx.ProcessLookupSQL(s), []string{"s", "s"}, []string{"k1", "k2"})
	// The relation that holds the records: idem_records or, in the
	// partitioned layout, its current partition.
	rel := "idem_records"
	if err := s.Pool().QueryRow(ctx, "SELECT coalesce((SELECT c.relname::text FROM "+qualified(s, "idem_records")+
		" AS r JOIN pg_class AS c ON c.oid = r.tableoid LIMIT 1), 'idem_records')").Scan(&rel); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if strings.Contains(plan, "Seq Scan on "+rel+" ") || !strings.Contains(plan, "Index Scan using "+rel+"_pkey") {
		t.Errorf("%s: the lookup's %s plan does not probe the index:\n%s", when, mode, plan)
	}
}

// explainPlan prepares sql in a transaction of its own whose
// plan_cache_mode forces a mode (generic or custom) plan, and returns the
// plan EXPLAIN EXECUTE gives for args.
func explainPlan(t *testing.T, ctx context.Context, s *idempgx.Store, mode, sql string, args ...any) string {
	t.Helper()
	name := "plan_" + randomSuffix()
	params := make([]string, len(args))
	for i := range args {
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	var plan string
	err := pgx.BeginFunc(ctx, s.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_"+mode+"_plan"); err != nil {
			return err
		}
		if _, err := tx.Prepare(ctx, name, sql); err != nil {
			return err
		}
		defer func() { _ = tx.Conn().Deallocate(ctx, name) }()
		rows, err := tx.Query(ctx, "EXPLAIN EXECUTE "+name+"("+strings.Join(params, ", ")+")",
			append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...)
		if err != nil {
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		plan = strings.Join(lines, "\n")
		return err
	})
	if err != nil {
		t.Fatalf("explain: %v", err)
	}
	return plan
}

// TestProcessBatchCachedLookup runs batches with duplicates and mismatches
// through connections that always use generic plans (the plan PostgreSQL
// caches with a prepared statement and may pick after five runs), and
// checks every outcome.
func TestProcessBatchCachedLookup(t *testing.T) {
	schema := migratedSchema(t)
	cfg, err := pgxpool.ParseConfig(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := idempgx.New(p, &idempgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	for b := range 16 {
		// 10 new keys, 3 seen in the previous batch with the same content,
		// 1 seen there with other content.
		var msgs []idem.Message
		want := map[string]idem.Outcome{}
		for i := range 10 {
			k := fmt.Sprintf("b%d-%d", b, i)
			msgs = append(msgs, idem.Message{Scope: "s", Key: k, Fingerprint: fp(k)})
			want[k] = idem.Processed
		}
		if b > 0 {
			for i := range 3 {
				k := fmt.Sprintf("b%d-%d", b-1, i)
				msgs = append(msgs, idem.Message{Scope: "s", Key: k, Fingerprint: fp(k)})
				want[k] = idem.Duplicate
			}
			k := fmt.Sprintf("b%d-9", b-1)
			msgs = append(msgs, idem.Message{Scope: "s", Key: k, Fingerprint: fp("other")})
			want[k] = idem.Mismatch
		}
		res, err := s.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []int) error { return nil })
		if err != nil {
			t.Fatalf("batch %d: %v", b, err)
		}
		for i, m := range msgs {
			if res[i] != want[m.Key] {
				t.Fatalf("batch %d, %s: %v, want %v", b, m.Key, res[i], want[m.Key])
			}
		}
	}
}
