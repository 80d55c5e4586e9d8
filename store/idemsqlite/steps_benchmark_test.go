package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
)

// BenchmarkGuardSteps prices recovery points on SQLite, side by side: one
// Guard.Do without steps (claim + complete), with three recorded lease
// steps (each one more write transaction), and with three transactional
// steps that each insert an effect row in the step's transaction. Run:
//
//	go test -run '^$' -bench GuardSteps -benchtime=500x
func BenchmarkGuardSteps(b *testing.B) {
	for _, mode := range []string{"no-steps", "3-steps", "3-tx-steps"} {
		b.Run(mode, func(b *testing.B) {
			s := newBenchStore(b)
			g := idem.NewGuard(s, nil)
			ctx := context.Background()
			fn := func(ctx context.Context, run idem.Run) ([]byte, error) {
				steps := idem.StepsOf(run)
				for _, name := range []string{"create-ride", "charge", "receipt"} {
					var err error
					switch mode {
					case "3-steps":
						_, err = steps.Do(ctx, name, func(context.Context, idem.Step) ([]byte, error) { return []byte(name), nil })
					case "3-tx-steps":
						_, err = idem.DoTx(ctx, steps, name, func(ctx context.Context, tx *sql.Tx, st idem.Step) ([]byte, error) {
							_, err := tx.ExecContext(ctx, "INSERT INTO effects (key) VALUES (?)", st.DownstreamKey)
							return []byte(name), err
						})
					}
					if err != nil {
						return nil, err
					}
				}
				return []byte("done"), nil
			}
			b.ResetTimer()
			for i := range b.N {
				call := idem.Call{Scope: "bench", Key: fmt.Sprintf("k%d", i)}
				if _, err := g.Do(ctx, call, fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
