package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// TestRetentionFill checks that the bulk fill of GroupRetention leaves
// tables like the store's own: the indexes of the migrations (the plain
// table) or of the partitioned parent, attached (the partitioned layout),
// no constraint of the fill left, only expired records; that the rows of
// each layout and retention run; and that Maintain then drops the whole
// filled partition.
func TestRetentionFill(t *testing.T) {
	ctx := context.Background()
	// A reference schema, migrated and nothing else, for the plain indexes.
	env, p, ref, _ := migratedSchema(t, "_retref")
	indexes := func(schema, table string) string {
		t.Helper()
		rows, err := p.pool.Query(ctx, `SELECT replace(indexdef, $1, 'S') FROM pg_indexes WHERE schemaname = $2 AND tablename = $3 ORDER BY 1`,
			schema+".", schema, table)
		if err != nil {
			t.Fatal(err)
		}
		defs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(defs, "\n")
	}
	const rows = 2000
	for _, c := range []struct {
		partitioned, retire bool
	}{{false, false}, {false, true}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("partitioned=%v,retire=%v", c.partitioned, c.retire), func(t *testing.T) {
			s := &Scenario{Group: GroupRetention, Name: t.Name(), Concurrency: 8, Messages: 300}
			run, err := prepRetention(ctx, env, s, rows, c.partitioned, c.retire)
			if err != nil {
				t.Fatal(err)
			}
			schema := fmt.Sprintf("%s_ret%d", p.schema, p.accounts)
			tbl := pgx.Identifier{schema, "idem_records"}.Sanitize()
			var n, live int
			if err := p.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE expires_at > now() OR state <> 'completed') FROM `+tbl+` WHERE scope = 'old'`).Scan(&n, &live); err != nil {
				t.Fatal(err)
			}
			if n != rows || live != 0 {
				t.Fatalf("%d rows, %d of them live, want %d expired", n, live, rows)
			}
			var checks int
			if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conname LIKE '%\_fill' AND connamespace = to_regnamespace($1)`, schema).Scan(&checks); err != nil {
				t.Fatal(err)
			}
			if checks != 0 {
				t.Errorf("%d constraints of the fill left", checks)
			}
			if !c.partitioned {
				if got, want := indexes(schema, "idem_records"), indexes(ref, "idem_records"); got != want {
					t.Errorf("indexes\n%s\nwant those of the migrations\n%s", got, want)
				}
			} else {
				// Every partition holds one index of each of the parent's.
				var bad int
				if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM pg_partition_tree(to_regclass($1)) t
WHERE t.isleaf AND (SELECT count(*) FROM pg_index x JOIN pg_inherits i ON i.inhrelid = x.indexrelid WHERE x.indrelid = t.relid) <> 3
	OR t.isleaf AND (SELECT count(*) FROM pg_index x WHERE x.indrelid = t.relid) <> 3`, tbl).Scan(&bad); err != nil {
					t.Fatal(err)
				}
				if bad != 0 {
					t.Errorf("%d partitions without exactly the parent's three indexes", bad)
				}
			}
			retired := false // the first fill's partition, by run 1
			for r := range 2 {
				if _, err := measureRun(ctx, env, s, run, r); err != nil {
					t.Fatal(err)
				}
				if r == 0 {
					if err := p.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, schema+".idem_records_p2").Scan(&retired); err != nil {
						t.Fatal(err)
					}
				}
			}
			if c.partitioned && c.retire {
				// Filled again before run 2; whatever the runs left, one
				// Maintain drops it all.
				store, err := idempgx.New(p.pool, &idempgx.Config{Schema: schema, Partitioned: true})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := store.Maintain(ctx, nil); err != nil {
					t.Fatal(err)
				}
				if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl+` WHERE scope = 'old'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("%d expired rows left after Maintain", n)
				}
				// Once run 1 retired it, the refill went back to the first
				// fill's bucket: the writes stayed in one partition, as in
				// the row without retention. (Whether so short a run
				// finished the drop depends on the machine's load;
				// TestRetentionRefill checks both cases.)
				if parts := leaves(t, p, tbl); retired && parts != 1 {
					t.Errorf("%d partitions left, want the current one", parts)
				}
			}
		})
	}
}

func leaves(t *testing.T, p *pgEnv, tbl string) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_partition_tree(to_regclass($1)) WHERE isleaf`, tbl).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRetentionRefill checks where the fills of the partitioned layout
// put their partition: the first after the current one, the writes
// rotated past it; a refill back in the first one's bucket once that is
// gone, without a rotation; and in a new bucket, rotated past, while it is
// still there.
func TestRetentionRefill(t *testing.T) {
	ctx := context.Background()
	_, p, schema, m := migratedSchema(t, "_retrefill")
	if err := m.Partition(ctx, nil); err != nil {
		t.Fatal(err)
	}
	tb := &retTable{pool: p.pool, schema: schema, partitioned: true, filled: map[string]int64{}}
	store, err := idempgx.New(p.pool, &idempgx.Config{Schema: schema, Partitioned: true})
	if err != nil {
		t.Fatal(err)
	}
	// cur and the rows of each partition after each fill.
	state := func() (int64, map[string]int) {
		t.Helper()
		var cur int64
		if err := p.pool.QueryRow(ctx, `SELECT cur FROM `+pgx.Identifier{schema, "idem_record_buckets"}.Sanitize()).Scan(&cur); err != nil {
			t.Fatal(err)
		}
		rows, err := p.pool.Query(ctx, `SELECT tableoid::regclass::text, count(*) FROM `+tb.table()+` GROUP BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for rows.Next() {
			var name string
			var n int
			if err := rows.Scan(&name, &n); err != nil {
				t.Fatal(err)
			}
			got[name[strings.LastIndex(name, ".")+1:]] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return cur, got
	}
	check := func(step string, wantCur int64, want map[string]int) {
		t.Helper()
		cur, got := state()
		if cur != wantCur || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: current bucket %d, rows %v; want %d, %v", step, cur, got, wantCur, want)
		}
	}
	if err := tb.fill(ctx, 100); err != nil {
		t.Fatal(err)
	}
	check("first fill", 3, map[string]int{"idem_records_p2": 100})
	// The empty partitions the conversion and rotations left are gone:
	// the filled one and the current one, as the drop row has once its
	// retention ran and it was filled again.
	if n := leaves(t, p, tb.table()); n != 2 {
		t.Errorf("%d partitions after the first fill, want p2 and p3", n)
	}
	// p2 still there: a new bucket, rotated past.
	if err := tb.fill(ctx, 50); err != nil {
		t.Fatal(err)
	}
	check("refill beside", 5, map[string]int{"idem_records_p2": 100, "idem_records_p4": 50})
	if _, err := store.Maintain(ctx, nil); err != nil {
		t.Fatal(err)
	}
	check("maintain", 5, map[string]int{})
	// p2 gone: back in its bucket, the writes left where they are.
	if err := tb.fill(ctx, 30); err != nil {
		t.Fatal(err)
	}
	check("refill", 5, map[string]int{"idem_records_p2": 30})
	if n := leaves(t, p, tb.table()); n != 2 {
		t.Errorf("%d partitions, want p2 and p5", n)
	}
}

// migratedSchema returns a bench Env (closed when t ends), its PostgreSQL
// and a schema of its own, name p.schema+suffix, migrated.
func migratedSchema(t *testing.T, suffix string) (*Env, *pgEnv, string, *idempgx.Migrator) {
	t.Helper()
	env, err := NewEnv(idemtest.ServiceURL(t, "IDEM_POSTGRES_URL"), "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	ctx := context.Background()
	p, err := postgres(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	schema := p.schema + suffix
	env.Cleanup(func() {
		_, _ = p.pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	m, err := idempgx.NewMigrator(p.pool, &idempgx.MigratorConfig{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	return env, p, schema, m
}
