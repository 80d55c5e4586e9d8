package storekit

import (
	"context"
	"log/slog"

	"github.com/idem-go/idem"
)

// StoredResult is what a store keeps of req's result: the result itself
// (an empty one for nil: a nil result is a valid empty result, not a
// tombstone), or, for a result over limit bytes, nothing and a tombstone,
// with a warning logged on logger under the store's name.
func StoredResult(ctx context.Context, logger *slog.Logger, store string, req idem.CompleteRequest, limit int) (result []byte, tombstone bool) {
	if len(req.Result) > limit {
		logger.WarnContext(ctx, store+": result too large to store, keeping a tombstone",
			"scope", req.Scope, "key", req.Key, "bytes", len(req.Result), "limit", limit)
		return nil, true
	}
	if req.Result == nil {
		return []byte{}, false
	}
	return req.Result, false
}
