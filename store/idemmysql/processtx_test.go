package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/idem-go/idem"
)

// ProcessTx in a REPEATABLE READ transaction whose snapshot predates a
// concurrent commit of the same message still sees that commit: the
// duplicate key sends it to a locking read, which reads the newest
// version, not the snapshot.
func TestProcessTxRepeatableReadSeesNewestCommit(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := newStore(t, nil)
	msg := idem.Message{Scope: "rr", Key: "m1", Fingerprint: idem.FingerprintBytes([]byte("a"))}

	tx, err := s.DB().BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var n int
	// The snapshot starts here, before the other delivery commits.
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM idem_records").Scan(&n); err != nil || n != 0 {
		t.Fatalf("count = %d, %v", n, err)
	}
	if res, err := s.Process(ctx, msg, func(context.Context, *sql.Tx) error { return nil }); res != idem.Processed || err != nil {
		t.Fatalf("first delivery = %q, %v", res, err)
	}
	res, err := s.ProcessTx(ctx, tx, msg)
	if res != idem.Duplicate || err != nil {
		t.Fatalf("ProcessTx under an older snapshot = %q, %v; want duplicate", res, err)
	}
	other := msg
	other.Fingerprint = idem.FingerprintBytes([]byte("b"))
	res, err = s.ProcessTx(ctx, tx, other)
	if res != idem.Mismatch || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("ProcessTx of other content = %q, %v; want mismatch", res, err)
	}
	// The failed inserts rolled back only themselves: tx is still usable.
	fresh := idem.Message{Scope: "rr", Key: "m2", Fingerprint: idem.FingerprintBytes([]byte("c"))}
	if res, err := s.ProcessTx(ctx, tx, fresh); res != idem.Processed || err != nil {
		t.Fatalf("ProcessTx of a new message in the same tx = %q, %v", res, err)
	}
	out, err := s.ProcessBatchTx(ctx, tx, []idem.Message{msg, fresh, {Scope: "rr", Key: "m3", Fingerprint: fresh.Fingerprint}})
	if err != nil || out[0] != idem.Duplicate || out[1] != idem.Duplicate || out[2] != idem.Processed {
		t.Fatalf("ProcessBatchTx in the same tx = %v, %v; want duplicate, duplicate (its own row), processed", out, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"m1", "m2", "m3"} {
		if _, err := s.Get(ctx, "rr", k); err != nil {
			t.Errorf("Get(%s) after commit: %v", k, err)
		}
	}
	if _, err := s.ProcessTx(ctx, nil, msg); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("ProcessTx(nil tx) = %v", err)
	}
}
