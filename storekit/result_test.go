package storekit_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
)

// TestStoredResult: a result within the limit is kept as it is, a nil one
// as an empty result, and one over the limit becomes a tombstone, with a
// warning that names the store and the key.
func TestStoredResult(t *testing.T) {
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	req := idem.CompleteRequest{Scope: "s", Key: "k", Token: 1, Result: []byte("1234")}
	if r, tomb := storekit.StoredResult(ctx, logger, "idemx", req, 4); string(r) != "1234" || tomb {
		t.Errorf("a result at the limit: %q, tombstone %v", r, tomb)
	}
	req.Result = nil
	if r, tomb := storekit.StoredResult(ctx, logger, "idemx", req, 4); r == nil || len(r) != 0 || tomb {
		t.Errorf("a nil result: %#v, tombstone %v; want an empty result", r, tomb)
	}
	if logs.Len() != 0 {
		t.Errorf("logged for results within the limit: %s", logs.String())
	}
	req.Result = []byte("12345")
	if r, tomb := storekit.StoredResult(ctx, logger, "idemx", req, 4); r != nil || !tomb {
		t.Errorf("a result over the limit: %q, tombstone %v", r, tomb)
	}
	if l := logs.String(); !strings.Contains(l, "idemx: result too large to store") || !strings.Contains(l, "key=k") || !strings.Contains(l, "bytes=5") {
		t.Errorf("the warning: %s", l)
	}
}
