package idemhttp

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

// nopStore is a durable-claiming store that is never called: for tests of
// the parts of the middleware that run before the store.
type nopStore struct{}

func (nopStore) Claim(context.Context, idem.ClaimRequest) (idem.Claim, error) { panic("unused") }
func (nopStore) Complete(context.Context, idem.CompleteRequest) error         { panic("unused") }
func (nopStore) Release(context.Context, string, string, int64) error         { panic("unused") }
func (nopStore) Extend(context.Context, string, string, int64, time.Duration) (time.Time, error) {
	panic("unused")
}
func (nopStore) Get(context.Context, string, string) (idem.Record, error) { panic("unused") }
func (nopStore) Delete(context.Context, string, string) error             { panic("unused") }
func (nopStore) Purge(context.Context, int) (int64, error)                { panic("unused") }
