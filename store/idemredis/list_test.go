package idemredis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
)

// A prefix with glob characters matches itself only: the store of prefix
// "…a*" does not list the records of the store of prefix "…ab".
func TestListPrefixIsLiteral(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	base := randomPrefix(t, c)
	ctx := context.Background()
	stores := map[string]*idemredis.Store{}
	for _, p := range []string{"a*", "ab", `a\[?]`} {
		s, err := idemredis.New(c, &idemredis.Config{Prefix: base + p, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "key-" + p, Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		stores[p] = s
	}
	for p, s := range stores {
		page, err := s.List(ctx, idem.ListRequest{Limit: idem.MaxListLimit})
		for err == nil && page.Next != "" && len(page.Records) == 0 {
			page, err = s.List(ctx, idem.ListRequest{Limit: idem.MaxListLimit, Cursor: page.Next})
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Records) != 1 || page.Records[0].Key != "key-"+p {
			t.Errorf("store of prefix %q lists %+v, want only its key %q", base+p, page.Records, "key-"+p)
		}
	}
}

func TestListCursorOfAnotherNode(t *testing.T) {
	t.Parallel()
	s := newStore(t, newClient(t), nil)
	_, err := s.List(context.Background(), idem.ListRequest{Cursor: "r1.0..10.0.0.9:6379"})
	if err == nil || !strings.Contains(err.Error(), "no longer a master") {
		t.Errorf("a cursor naming a node the client does not know: want an error saying so, got %v", err)
	}
	for _, c := range []string{"r1.x..", "r1.0.AAAA.", "r1.0.!!.", "r1.0", "k1.abc"} {
		_, err = s.List(context.Background(), idem.ListRequest{Cursor: c})
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("cursor %q: want ErrInvalidConfig, got %v", c, err)
		}
	}
}
