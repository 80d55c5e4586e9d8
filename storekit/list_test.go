package storekit_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// sortedRead serves n records "s"/"k%06d" in order, counting what it reads.
func sortedRead(n int, read *int) storekit.ReadAfter {
	return func(_ context.Context, pos storekit.Position, _ string, max int) ([]idem.Record, error) {
		var out []idem.Record
		for i := range n {
			key := fmt.Sprintf("k%06d", i)
			if (pos.Scope < "s" || pos.Scope == "s" && key > pos.Key) && len(out) < max {
				out = append(out, idem.Record{Scope: "s", Key: key, Result: []byte("r")})
			}
		}
		*read += len(out)
		return out, nil
	}
}

// A filter that matches only the last of many records costs at most
// ListExamine records per call: the first pages are empty but go on.
func TestListOrderedBoundsWhatOneCallReads(t *testing.T) {
	const n = 3*storekit.ListExamine + 10
	var read int
	req := idem.ListRequest{Filter: idem.ListFilter{Key: fmt.Sprintf("k%06d", n-1)}}
	var got []idem.Record
	for calls := 1; ; calls++ {
		read = 0
		page, err := storekit.ListOrdered(context.Background(), req, sortedRead(n, &read))
		if err != nil {
			t.Fatal(err)
		}
		if read > storekit.ListExamine {
			t.Fatalf("call %d read %d records, more than ListExamine (%d)", calls, read, storekit.ListExamine)
		}
		got = append(got, page.Records...)
		if page.Next == "" {
			if calls != 4 {
				t.Errorf("want 4 calls, took %d", calls)
			}
			break
		}
		req.Cursor = page.Next
	}
	if len(got) != 1 || got[0].Key != req.Filter.Key || got[0].Result != nil {
		t.Fatalf("want the one matching record without its result, got %+v", got)
	}
}

func TestListOrderedErrors(t *testing.T) {
	boom := errors.New("boom")
	_, err := storekit.ListOrdered(context.Background(), idem.ListRequest{},
		func(context.Context, storekit.Position, string, int) ([]idem.Record, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Errorf("a read error must come back, got %v", err)
	}
	for _, c := range []string{"k1.", "k1.!!", "x1.AA", "k1." + "_w"} {
		if _, err := storekit.ParseCursor(c); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("ParseCursor(%q): want ErrInvalidConfig, got %v", c, err)
		}
	}
	p := storekit.Position{Scope: "a\x00b", Key: "k"}
	if q, err := storekit.ParseCursor(p.Cursor()); err != nil || q != p {
		t.Errorf("cursor round trip: got %+v, %v; want %+v", q, err, p)
	}
}
