package idemmysql_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
)

// Purge deletes expired records in batches and trims the token counter's
// table to its newest row; tokens issued afterwards keep increasing.
func TestPurgeTrimsTokens(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s := newStore(t, &idemmysql.Config{PurgeBatch: 3})
	var last int64
	for i := range 10 {
		key := fmt.Sprintf("k%d", i)
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: idem.FingerprintBytes([]byte(key)), Lease: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if c.Token <= last {
			t.Fatalf("token %d after %d", c.Token, last)
		}
		last = c.Token
		if err := s.Complete(ctx, idem.CompleteRequest{Key: key, Token: c.Token, Retention: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond)
	n, err := s.Purge(ctx, 0)
	if err != nil || n != 10 {
		t.Fatalf("Purge = %d, %v; want 10 in batches of 3", n, err)
	}
	var rows int
	if err := s.DB().QueryRow("SELECT COUNT(*) FROM idem_tokens").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("idem_tokens keeps %d rows (%v); want the newest only", rows, err)
	}
	c, err := s.Claim(ctx, idem.ClaimRequest{Key: "k0", Fingerprint: idem.FingerprintBytes([]byte("k0")), Lease: time.Hour})
	if err != nil || c.Outcome != idem.Acquired || c.Token <= last {
		t.Fatalf("claim after purge = %+v, %v; want a token above %d", c, err, last)
	}
	if _, err := s.Purge(ctx, -1); err == nil {
		t.Fatal("Purge(-1) succeeded")
	}
}
