package idemsqlite

import (
	"context"
	"path/filepath"
	"testing"
)

// TestHotStmtsNeverWaitForAConnection holds the pool's only connection,
// as the transactions of concurrent Process calls did when 40 of them
// deadlocked: asking for a statement not prepared yet must return at once
// (the caller runs the query unprepared), and the statement is prepared
// once a connection is free.
func TestHotStmtsNeverWaitForAConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := OpenDB(ctx, "sqlite://"+filepath.Join(t.TempDir(), "hot.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var h hotStmts
	done := make(chan bool)
	go func() { done <- h.stmt(db, "SELECT 1") == nil }()
	if !<-done { // a deadlock here fails the test by its timeout
		t.Fatal("a statement was prepared while the pool had no free connection")
	}
	if h.stmt(db, "SELECT 1") != nil {
		t.Fatal("prepared while the pool had no free connection")
	}
	if err := conn.Close(); err != nil { // the background preparation can go on
		t.Fatal(err)
	}
	h.settle()
	st := h.stmt(db, "SELECT 1")
	if st == nil {
		t.Fatal("not prepared once a connection was free")
	}
	var one int
	if err := st.QueryRowContext(ctx).Scan(&one); err != nil || one != 1 {
		t.Fatalf("prepared statement: %d, %v", one, err)
	}
	if err := h.close(); err != nil {
		t.Fatal(err)
	}
	if h.stmt(db, "SELECT 2") != nil || len(h.m) != 0 {
		t.Fatal("statements after close")
	}
	h.settle()
}

// TestHotStmtsFailedPrepareIsNotCached: a statement that cannot be
// prepared is not kept, and the next call tries again (the caller runs
// the query as it is and meets the error there).
func TestHotStmtsFailedPrepareIsNotCached(t *testing.T) {
	t.Parallel()
	db, err := OpenDB(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "hot.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var h hotStmts
	for range 2 {
		if h.stmt(db, "SELECT FROM nowhere") != nil {
			t.Fatal("a statement that cannot be prepared was returned")
		}
		h.settle()
		h.mu.Lock()
		cached, preparing := len(h.m), len(h.preparing)
		h.mu.Unlock()
		if cached != 0 || preparing != 0 {
			t.Fatalf("after a failed preparation: %d cached, %d preparing; want none", cached, preparing)
		}
	}
	if err := h.close(); err != nil {
		t.Fatal(err)
	}
}
