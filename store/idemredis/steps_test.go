package idemredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
)

func TestStepsConformance(t *testing.T) {
	c := newClient(t)
	storetest.RunSteps(t, func(t *testing.T) idem.Store { return newStore(t, c, nil) },
		&storetest.Options{ClockPrecision: time.Millisecond, ExpiresByTTL: true})
}

// A listing never returns the steps' hashes, and Delete removes them.
func TestStepsKeyApartFromRecords(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	s := newStore(t, c, nil)
	cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "sc", Key: "k", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.RecordStep(ctx, idem.StepRequest{Scope: "sc", Key: "k", Token: cl.Token, Name: "charge", Result: []byte("ch_1"), Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// Every page, not the first: a page scans a bounded number of keys of
	// the whole database, which on a shared server holds other keys.
	var recs []idem.Record
	for req := (idem.ListRequest{Limit: 10}); ; {
		page, err := s.List(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, page.Records...)
		if req.Cursor = page.Next; req.Cursor == "" {
			break
		}
	}
	if len(recs) != 1 || recs[0].Key != "k" {
		t.Fatalf("List: %+v; want the one record", recs)
	}
	if sk, rk := s.StepsKey("sc", "k"), s.RecordKey("sc", "k"); sk[len(sk)-66:] != rk[len(rk)-66:] {
		t.Errorf("steps key %s and record key %s must share the hash tag", sk, rk)
	}
	if err := s.Delete(ctx, "sc", "k"); err != nil {
		t.Fatal(err)
	}
	n, err := c.Do(ctx, c.B().Exists().Key(s.StepsKey("sc", "k")).Build()).AsInt64()
	if err != nil || n != 0 {
		t.Errorf("the steps' hash survived Delete: %d, %v", n, err)
	}
}
