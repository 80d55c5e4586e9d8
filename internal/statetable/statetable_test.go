package statetable

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

type state string

func TestStatsInOrder(t *testing.T) {
	tally := Tally[state]{}
	tally.Add("dead", 2, time.Second)
	tally.Add("other", 9, 0) // not a listed state: left out
	got := tally.In([]state{"pending", "dead"})
	want := []Count[state]{{State: "pending"}, {State: "dead", Count: 2, Oldest: time.Second}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestListLimit(t *testing.T) {
	for _, c := range []struct{ in, want int }{{0, DefaultListLimit}, {1, 1}, {MaxBatch, MaxBatch}} {
		if n, err := ListLimit("t", ListRequest[state]{Limit: c.in}); err != nil || n != c.want {
			t.Errorf("ListLimit(%d) = %d, %v; want %d", c.in, n, err, c.want)
		}
	}
	for _, in := range []int{-1, MaxBatch + 1} {
		_, err := ListLimit("outbox", ListRequest[state]{Limit: in})
		if !errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "outbox: list limit must be 1..1000") {
			t.Errorf("ListLimit(%d): %v", in, err)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, sel := range []Select{{}, {IDs: []int64{1}, All: true}, {IDs: make([]int64, MaxBatch+1)}} {
		if err := ValidateSelect("inbox", sel); !errors.Is(err, idem.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), idem.ErrInvalidConfig.Error()+": inbox: ") {
			t.Errorf("ValidateSelect(%d ids, all %v): %v", len(sel.IDs), sel.All, err)
		}
	}
	if err := ValidateSelect("inbox", Select{All: true}); err != nil {
		t.Error(err)
	}
	if err := ValidateClaim("outbox", 1, time.Second); err != nil {
		t.Error(err)
	}
	if err := ValidateClaim("outbox", 0, time.Second); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Error(err)
	}
	if err := ValidateClaim("outbox", 1, 0); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Error(err)
	}
	ids, toks := LeaseArrays([]Lease{{1, 10}, {2, 20}})
	if !slices.Equal(ids, []int64{1, 2}) || !slices.Equal(toks, []int64{10, 20}) {
		t.Errorf("LeaseArrays: %v %v", ids, toks)
	}
	if got := CutError(strings.Repeat("é", MaxErrorBytes)); len(got) > MaxErrorBytes {
		t.Errorf("CutError kept %d bytes", len(got))
	}
}
