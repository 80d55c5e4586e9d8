package idemmysql_test

import (
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
)

// Concurrent duplicates are serialised by the unique key: of many
// deliveries of one message at once, exactly one runs its handler and
// commits, the others are duplicates, and no call fails.
func TestProcessDuplicateStorm(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	env := newProcessEnv(t)
	const workers, keys = 16, 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		runs = map[string]int{}
	)
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				key := fmt.Sprintf("storm-%d", (k+w)%keys)
				msg := idem.Message{Scope: "storm", Key: key, Fingerprint: idem.FingerprintBytes([]byte(key))}
				res, err := env.Process(ctx, msg, nil)
				if err != nil {
					t.Errorf("Process(%s): %v", key, err)
					return
				}
				if res == idem.Processed {
					mu.Lock()
					runs[key]++
					mu.Unlock()
				} else if res != idem.Duplicate {
					t.Errorf("Process(%s) = %s", key, res)
				}
			}
		})
	}
	wg.Wait()
	effects, err := env.Effects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		key := fmt.Sprintf("storm-%d", k)
		if runs[key] != 1 || effects[key] != 1 {
			t.Errorf("%s: processed %d times, %d effects; want exactly 1", key, runs[key], effects[key])
		}
	}
}

// Overlapping batches at once, in different orders: each key is fresh in
// exactly one batch, no batch deadlocks for good, and the handler is handed
// only the fresh messages.
func TestProcessBatchStorm(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	env := newProcessEnv(t)
	const workers, keys = 8, 40
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		fresh = map[string]int{}
	)
	for w := range workers {
		wg.Go(func() {
			msgs := make([]idem.Message, 0, keys)
			for k := range keys {
				key := fmt.Sprintf("b-%02d", (k*7+w*3)%keys) // every batch holds every key, in its own order
				msgs = append(msgs, idem.Message{Scope: "storm", Key: key, Fingerprint: idem.FingerprintBytes([]byte(key))})
			}
			out, err := env.ProcessBatch(ctx, msgs, nil)
			if err != nil {
				t.Errorf("ProcessBatch: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i, r := range out {
				switch r {
				case idem.Processed:
					fresh[msgs[i].Key]++
				case idem.Duplicate:
				default:
					t.Errorf("%s: %s", msgs[i].Key, r)
				}
			}
		})
	}
	wg.Wait()
	effects, err := env.Effects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		key := fmt.Sprintf("b-%02d", k)
		if fresh[key] != 1 || effects[key] != 1 {
			t.Errorf("%s: fresh in %d batches, %d effects; want exactly 1", key, fresh[key], effects[key])
		}
	}
}

// Whatever the DSN says about time (parseTime, loc), the store reads and
// writes UTC: a lease comes back as it was granted, by the server clock.
func TestTimesIgnoreDSNLocation(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	base := newStore(t, nil)
	var name string
	if err := base.DB().QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	for _, parse := range []bool{false, true} {
		cfg := driverConfig(t)
		cfg.DBName, cfg.ParseTime, cfg.Loc = name, parse, tokyo
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		t.Cleanup(func() { _ = db.Close() })
		s, _ := idemmysql.New(db, nil)
		key := fmt.Sprintf("tz-%v", parse)
		before := time.Now()
		claim, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: idem.FingerprintBytes([]byte(key)), Lease: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := base.Get(ctx, "", key)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.LeaseExpiresAt.Equal(claim.LeaseExpiresAt) {
			t.Errorf("parseTime=%v: claim says the lease ends %v, the record %v", parse, claim.LeaseExpiresAt, rec.LeaseExpiresAt)
		}
		if d := claim.LeaseExpiresAt.Sub(before); d < 59*time.Minute || d > 61*time.Minute {
			t.Errorf("parseTime=%v: lease ends %v after now; want an hour (server and test clocks in UTC)", parse, d)
		}
		got, err := s.Get(ctx, "", key)
		if err != nil || !got.LeaseExpiresAt.Equal(rec.LeaseExpiresAt) || !got.CreatedAt.Equal(rec.CreatedAt) {
			t.Errorf("parseTime=%v: Get through the DSN = %+v, %v; want %+v", parse, got, err, rec)
		}
	}
}
