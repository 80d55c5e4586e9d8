package idemmysql_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
)

// Claims stuck on a row lock never take the connections kept for lease
// holders: with every connection open to claims waiting, a heartbeat
// (Extend) and a Complete still go through at once.
func TestHoldersGoFirst(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := migratedDB(t, 4)
	s, err := idemmysql.New(db, &idemmysql.Config{HolderConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	if st := s.ConnStats(); st.MaxConns != 4 || st.HolderConns != 1 || st.GatedConns != 3 {
		t.Fatalf("ConnStats = %+v", st)
	}
	fp := idem.FingerprintBytes([]byte("x"))
	held, err := s.Claim(ctx, idem.ClaimRequest{Key: "held", Fingerprint: fp, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// An expired lease that the claims will try to take over, locked by a
	// transaction of another pool.
	if _, err := s.Claim(ctx, idem.ClaimRequest{Key: "hot", Fingerprint: fp, Lease: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	locker := adminDB(t)
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	lock, err := locker.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback()
	if _, err := lock.ExecContext(ctx, "SELECT * FROM "+name+".idem_records WHERE scope = '' AND `key` = 'hot' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			c, err := s.Claim(ctx, idem.ClaimRequest{Key: "hot", Fingerprint: fp, Lease: time.Minute})
			if err != nil || (c.Outcome != idem.Acquired && c.Outcome != idem.InProgress) {
				t.Errorf("claim = %+v, %v", c, err)
			}
		})
	}
	for s.ConnStats().GatedWaiting < 3 { // three claims hold the gated connections, three wait
		if ctx.Err() != nil {
			t.Fatalf("the claims never filled the gate: %+v", s.ConnStats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := s.Extend(hctx, "", "held", held.Token, time.Minute); err != nil {
		t.Fatalf("heartbeat behind stuck claims: %v", err)
	}
	if err := s.Complete(hctx, idem.CompleteRequest{Key: "held", Token: held.Token, Retention: time.Minute}); err != nil {
		t.Fatalf("complete behind stuck claims: %v", err)
	}
	// A claim that gives up while it waits for the gate says why.
	gctx, gcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer gcancel()
	if _, err := s.Get(gctx, "", "held"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "kept for lease holders") {
		t.Fatalf("Get waiting for the gate = %v; want the context's error, saying what it waited for", err)
	}
	_ = lock.Rollback()
	wg.Wait()
	if st := s.ConnStats(); st.GatedWaits < 3 || st.GatedWaitTime <= 0 {
		t.Fatalf("ConnStats after = %+v", st)
	}
}

func TestHolderConnsConfig(t *testing.T) {
	t.Parallel()
	db := newDBOrNil(t)
	db.SetMaxOpenConns(8)
	for _, bad := range []int{-1, 8, 9} {
		if _, err := idemmysql.New(db, &idemmysql.Config{HolderConns: bad}); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("HolderConns %d: %v; want ErrInvalidConfig", bad, err)
		}
	}
	s, _ := idemmysql.New(db, nil)
	if st := s.ConnStats(); st.HolderConns != 2 || st.GatedConns != 6 {
		t.Errorf("default for 8 connections: %+v", st)
	}
	db.SetMaxOpenConns(0)
	s, _ = idemmysql.New(db, nil)
	if st := s.ConnStats(); st.HolderConns != 0 || st.GatedConns != 0 || st.MaxConns != 0 {
		t.Errorf("unlimited pool: %+v", st)
	}
}
