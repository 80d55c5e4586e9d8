package idemsqlite

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// A handler that panics inside Process must not leave its transaction, and
// SQLite's write lock, open: the next Process of the same message runs at
// once and applies the effect exactly once.
func TestProcessRollsBackOnPanic(t *testing.T) {
	s := newTestStore(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE effects (id TEXT)`); err != nil {
		t.Fatal(err)
	}
	msg := idem.Message{Scope: "panic", Key: "m-1"}
	effect := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (id) VALUES ('m-1')`)
		return err
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the handler's panic did not reach the caller")
			}
		}()
		_, _ = s.Process(ctx, msg, func(ctx context.Context, tx *sql.Tx) error {
			if err := effect(ctx, tx); err != nil {
				return err
			}
			panic("handler bug")
		})
	}()
	// Without the rollback this waits for the write lock until ctx ends.
	out, err := s.Process(ctx, msg, effect)
	if err != nil || out != idem.Processed {
		t.Fatalf("redelivery after a panic: %v, %v; want %v", out, err, idem.Processed)
	}
	var n int
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}
