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
	pg := idemtest.ServiceURL(t, "IDEM_POSTGRES_URL")
	env, err := NewEnv(pg, "")
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	ctx := context.Background()
	p, err := postgres(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	// A reference schema, migrated and nothing else, for the plain indexes.
	ref := p.schema + "_retref"
	env.Cleanup(func() {
		_, _ = p.pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{ref}.Sanitize()+" CASCADE")
	})
	m, err := idempgx.NewMigrator(p.pool, &idempgx.MigratorConfig{Schema: ref})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
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
			for r := range 2 {
				if _, err := measureRun(ctx, env, s, run, r); err != nil {
					t.Fatal(err)
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
			}
		})
	}
}
