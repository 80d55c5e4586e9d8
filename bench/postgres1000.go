package bench

import "context"

// BigBatchSize is the batch of the PostgreSQL group of large batches: what
// one Kafka or JetStream fetch brings.
const BigBatchSize = 1000

// GroupPostgres1000 holds idem's ProcessBatch at the size of a broker fetch
// next to its own ceiling, the same multi-row insert of 1,000 keys.
const GroupPostgres1000 = "PostgreSQL: batches of 1,000"

// Row names of GroupPostgres1000, for the headline table.
const (
	PG1000Ceiling = "raw INSERT … ON CONFLICT DO NOTHING ×1000"
	PG1000Batch   = "idem ProcessBatch ×1000"
)

// postgres1000Scenarios runs five times the batched size per run, so that
// even 32 consumers each get several batches of 1,000.
func postgres1000Scenarios(batched int) []*Scenario {
	n := 5 * batched
	var out []*Scenario
	for _, c := range []int{1, 8, 32} {
		for _, d := range []int{0, 30} {
			row := func(name string, role Role, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) {
				out = append(out, &Scenario{Group: GroupPostgres1000, Name: name, Role: role, Concurrency: c, DupPercent: d,
					Messages: n, Note: note, Needs: NeedsPostgres, Prepare: prep})
			}
			row(PG1000Ceiling, RoleCeiling, "no effect, no transaction", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
				return prepPGCeilingN(ctx, env, s, BigBatchSize)
			})
			row(PG1000Batch, RoleIdem, "ledger effect in the same transaction", func(ctx context.Context, env *Env, s *Scenario) (Run, error) {
				return prepPGBatchN(ctx, env, s, BigBatchSize)
			})
		}
	}
	return out
}
