package idempgx_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
)

// TestPartitionedBatchPlans: in the partitioned layout, the statements
// that insert a batch's records look for each key in the other partitions
// with an index probe, also when the batch is large and an older partition
// holds, by its statistics, one bucket only. The planner estimates the
// older partition's rows with "bucket <> current" at one, and for a batch
// of a thousand keys it used to plan the check as a nested loop over a
// scan of that partition: every key compared with every record (22 s for
// a batch against 200,000 records). PostgreSQL makes a custom plan, for
// the values at hand, for the first five runs of a prepared statement on
// each connection.
func TestPartitionedBatchPlans(t *testing.T) {
	t.Parallel()
	s := newPartitionedStore(t, nil)
	ctx := ctxT(t)
	fillOlder(t, s, "s", 50_000) // into partition 1; 2 is then current
	const n = 1000
	scopes, keys, fps, rets := make([]string, n), make([]string, n), make([][]byte, n), make([]int64, n)
	for i := range n {
		scopes[i], keys[i], fps[i], rets[i] = "s", fmt.Sprint("new-", i), make([]byte, 32), 3_600_000_000
	}
	first, takeover := idempgx.ProcessBatchSQL(s)
	for _, st := range []struct{ name, sql string }{{"first pass", first}, {"takeover", takeover}} {
		plan := explainPlan(t, ctx, s, "custom", st.sql, scopes, keys, fps, rets)
		if strings.Contains(plan, "Seq Scan on idem_records_p1 ") || !strings.Contains(plan, "idem_records_p1_pkey") {
			t.Errorf("the %s does not probe the older partition's index:\n%s", st.name, plan)
		}
	}
	// And the batch itself, on the connections those plans are made on.
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{Scope: "s", Key: keys[i], Fingerprint: fp(keys[i])}
	}
	msgs[n-1] = idem.Message{Scope: "s", Key: "old-7", Fingerprint: fp("x")}
	res, err := s.ProcessBatch(ctx, msgs, func(context.Context, pgx.Tx, []int) error { return nil })
	if err != nil || res[0] != idem.Processed || res[n-1] != idem.Mismatch {
		t.Fatalf("batch: first %v, last %v, %v; want processed, mismatch", res[0], res[n-1], err)
	}
}
