// Package outboxdriver is the contract between the outbox relay (package
// outbox) and the databases that hold outbox tables, and the helpers every
// implementation shares, as inbox/inboxdriver is for the inbox. Implement
// [Backend] (store/idempgx, store/idemsqlite and store/idemmysql do) and run
// the conformance suite, outbox/outboxtest.
//
// The data types users see (Event, Row, State, StateCount, ListRequest,
// Select, Admin and the limits) are declared here so that the relay and the
// drivers share them; package outbox re-exports them under the same names,
// and users need not import this package. StateCount, ListRequest, Select
// and Lease are aliases of the state-table types the inbox shares (over its
// own State for the first two).
package outboxdriver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/textproto"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/statetable"
	"github.com/idem-go/idem/internal/textcut"
)

// Limits on what the outbox stores, checked by [Prepare] before the
// caller's transaction is touched.
const (
	// MaxIDLen is the longest event id, in bytes (printable ASCII).
	MaxIDLen = idem.MaxKeyLen
	// MaxTopicLen is the longest topic, in bytes of UTF-8 (long enough for
	// an SQS queue URL).
	MaxTopicLen = 1024
	// MaxKeyLen is the longest ordering key, in bytes of UTF-8.
	MaxKeyLen = 255
	// MaxPayloadBytes is the largest payload: 1 MiB, the default limit of
	// NATS and Kafka (SQS takes 256 KiB; its publisher refuses larger
	// events permanently, so they go to the dead state).
	MaxPayloadBytes = 1 << 20
	// MaxHeaders is the most headers one event may carry.
	MaxHeaders = 64
	// MaxHeaderNameLen and MaxHeaderValueLen bound one header.
	MaxHeaderNameLen  = 255
	MaxHeaderValueLen = 4096
	// MaxErrorBytes bounds a stored error text; longer texts are cut.
	MaxErrorBytes = statetable.MaxErrorBytes
	// MaxBatch is the largest claim, list or selection a backend serves in
	// one statement, and the most events one Write takes.
	MaxBatch = statetable.MaxBatch
)

// State is where an outbox event is in its life.
type State string

const (
	// StatePending: written by a committed transaction, waiting for its
	// next publish attempt (NextAttemptAt).
	StatePending State = "pending"
	// StateSending: claimed by a relay whose lease ends at LeaseExpiresAt.
	// After that the event is due again and the next claim takes it over.
	StateSending State = "sending"
	// StateSent: the broker confirmed it. It stays until the retention has
	// passed and a purge deletes it.
	StateSent State = "sent"
	// StateDead: given up (max attempts or a permanent error). It stays
	// until redriven or discarded.
	StateDead State = "dead"
)

// States lists every state, in life order. The slice is new on each call.
func States() []State { return []State{StatePending, StateSending, StateSent, StateDead} }

// ParseState returns the state named s, or an error.
func ParseState(s string) (State, error) {
	for _, st := range States() {
		if string(st) == s {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: outbox: unknown state %q (pending, sending, sent or dead)", idem.ErrInvalidConfig, s)
}

// Event is one event a producer writes in its own transaction.
type Event struct {
	// Topic is where the event goes, as the relay's Publisher reads it (an
	// AMQP routing key, a NATS subject, a Kafka topic, an SQS queue URL):
	// 1–MaxTopicLen bytes of UTF-8.
	Topic string
	// Key orders events: with Config.Ordered the relay keeps at most one
	// event per Key in flight, in write order. Publishers map it to the
	// broker's partitioning. 0–MaxKeyLen bytes of UTF-8.
	Key string
	// ID is the event's stable id: the broker's dedupe id and the id idem's
	// consumers dedupe on. 1–MaxIDLen bytes of printable ASCII, unique per
	// outbox: writing an id that is already in the outbox is a no-op (a
	// producer's retry of the same transaction). Empty: a random 128-bit id
	// is drawn at Write (never the content hash, which would merge two
	// distinct events with equal payloads; pass idem.ContentID(payload)
	// yourself when equal payloads are the same event).
	ID string
	// Payload is the event body, at most MaxPayloadBytes.
	Payload []byte
	// Headers are passed to the broker as headers or attributes: at most
	// MaxHeaders, names 1–MaxHeaderNameLen bytes of printable ASCII
	// without spaces, values at most MaxHeaderValueLen bytes of UTF-8.
	// Authorization, Cookie and Set-Cookie are refused: the outbox table
	// is read by operators and the CLI.
	Headers map[string]string
}

// credentialHeaders are never stored.
var credentialHeaders = map[string]bool{"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Set-Cookie": true}

// Prepare validates ev and fills in a random id when it has none. Drivers
// call it for every event before they touch the caller's transaction.
func Prepare(ev Event) (Event, error) {
	if ev.ID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		ev.ID = hex.EncodeToString(b[:])
	}
	if err := idem.ValidateKey(ev.ID); err != nil {
		return ev, fmt.Errorf("outbox: event id %q: %w", textcut.Cut(ev.ID, 64), err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: outbox: event %q: "+format, append([]any{idem.ErrInvalidConfig, ev.ID}, args...)...)
	}
	switch {
	case ev.Topic == "" || len(ev.Topic) > MaxTopicLen || !utf8.ValidString(ev.Topic):
		return ev, bad("topic must be 1-%d bytes of UTF-8", MaxTopicLen)
	case len(ev.Key) > MaxKeyLen || !utf8.ValidString(ev.Key):
		return ev, bad("key must be at most %d bytes of UTF-8", MaxKeyLen)
	case len(ev.Payload) > MaxPayloadBytes:
		return ev, bad("payload is %d bytes, the limit is %d", len(ev.Payload), MaxPayloadBytes)
	case len(ev.Headers) > MaxHeaders:
		return ev, bad("%d headers, the limit is %d", len(ev.Headers), MaxHeaders)
	}
	for k, v := range ev.Headers {
		if k == "" || len(k) > MaxHeaderNameLen {
			return ev, bad("header name must be 1-%d bytes", MaxHeaderNameLen)
		}
		for i := 0; i < len(k); i++ {
			if c := k[i]; c <= 0x20 || c > 0x7e {
				return ev, bad("header name %q: byte 0x%02x is not printable ASCII", textcut.Cut(k, 64), c)
			}
		}
		if credentialHeaders[textproto.CanonicalMIMEHeaderKey(k)] {
			return ev, bad("header %q carries credentials and is never stored", k)
		}
		if len(v) > MaxHeaderValueLen || !utf8.ValidString(v) {
			return ev, bad("header %q must be at most %d bytes of UTF-8", k, MaxHeaderValueLen)
		}
	}
	if ev.Payload == nil {
		ev.Payload = []byte{}
	}
	return ev, nil
}

// PrepareAll runs [Prepare] over evs (1..MaxBatch of them) into a new slice.
func PrepareAll(evs []Event) ([]Event, error) {
	if len(evs) == 0 || len(evs) > MaxBatch {
		return nil, fmt.Errorf("%w: outbox: write 1..%d events at once, got %d", idem.ErrInvalidConfig, MaxBatch, len(evs))
	}
	out := make([]Event, len(evs))
	for i, ev := range evs {
		p, err := Prepare(ev)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// EncodeHeaders is how drivers store headers: a JSON object, or "" when
// there are none.
func EncodeHeaders(h map[string]string) string {
	if len(h) == 0 {
		return ""
	}
	b, _ := json.Marshal(h) // a map[string]string of valid UTF-8 always marshals
	return string(b)
}

// DecodeHeaders reverses [EncodeHeaders].
func DecodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("outbox: stored headers: %w", err)
	}
	return h, nil
}

// Row is a stored outbox event.
type Row struct {
	// ID is the row's id: the outbox's write order.
	ID      int64
	EventID string
	Topic   string
	Key     string
	Payload []byte
	Headers map[string]string
	State   State
	// Attempts counts the failed publishes so far.
	Attempts int
	// Token is the fencing token of the latest claim (0 if never claimed).
	Token int64
	// LastError is the latest failure, root cause first.
	LastError string
	// DeadReason says why the event is dead (empty unless it is):
	// idem.DeadMaxAttempts or idem.DeadPermanent.
	DeadReason idem.DeadReason
	// CreatedAt is when the producer's transaction wrote the event.
	CreatedAt time.Time
	// NextAttemptAt is when a pending event is due (for a sending one, its
	// lease expiry).
	NextAttemptAt  time.Time
	LeaseExpiresAt time.Time
	// LastAttemptAt is when the latest claim took the event (zero if never).
	LastAttemptAt time.Time
	// FinishedAt is when the event was marked sent or dead (zero otherwise).
	FinishedAt time.Time
}

// Lease identifies one claimed event: its row id and the fencing token of
// the claim. It is the inbox's Lease too (inboxdriver.Lease).
type Lease = statetable.Lease

// Lease returns the row's lease.
func (r Row) Lease() Lease { return Lease{ID: r.ID, Token: r.Token} }

// ClaimRequest asks a backend for due events.
type ClaimRequest struct {
	// Limit is how many events to claim, 1..MaxBatch.
	Limit int
	// Lease is how long the claim holds, by the database clock.
	Lease time.Duration
	// Ordered skips events that have an earlier event with the same Key
	// that is not sent (pending, sending or dead): one in flight per Key,
	// and a dead event holds its Key back until it is redriven or
	// discarded.
	Ordered bool
}

// FailRequest records a failed publish of one claimed event.
type FailRequest struct {
	Lease
	// Error is the failure's text (cut to MaxErrorBytes).
	Error string
	// Delay schedules the next attempt at the database's now + Delay.
	Delay time.Duration
	// Dead moves the event to the dead state with DeadReason.
	Dead       bool
	DeadReason idem.DeadReason
	// Uncounted leaves attempts unchanged: an infrastructure failure, not
	// the event's fault.
	Uncounted bool
}

// StateCount is one line of [Admin.Stats]: State, Count, and Oldest, the
// age by the database clock of the oldest event in the state (by write
// time), zero when Count is 0.
type StateCount = statetable.Count[State]

// ListRequest selects events for [Admin.List]: those in State with a row
// id above AfterID (paging), at most Limit (1..MaxBatch; 0 means 100).
type ListRequest = statetable.ListRequest[State]

// Select names dead events for Redrive and Discard: the given row ids, or
// every dead event with All. It is the inbox's Select too
// (inboxdriver.Select).
type Select = statetable.Select

// Admin is the operator's view of an outbox (the CLI uses it; package
// outbox re-exports it).
type Admin interface {
	// Stats counts events by state, every state listed.
	Stats(ctx context.Context) ([]StateCount, error)
	// List returns events in a state by row id.
	List(ctx context.Context, req ListRequest) ([]Row, error)
	// Get returns one event by row id, or an error wrapping
	// idem.ErrNotFound.
	Get(ctx context.Context, id int64) (Row, error)
	// GetByEventID returns one event by its event id, or an error wrapping
	// idem.ErrNotFound.
	GetByEventID(ctx context.Context, eventID string) (Row, error)
	// Redrive moves dead events back to pending with attempts reset and
	// the next attempt now; it returns how many it moved.
	Redrive(ctx context.Context, sel Select) (int64, error)
	// Discard deletes dead events and returns how many.
	Discard(ctx context.Context, sel Select) (int64, error)
	// PurgeSent deletes sent events older than olderThan (by sent time,
	// database clock), at most limit (0: the backend's default) per
	// statement, each in its own transaction, until none is left, and
	// returns how many it deleted.
	PurgeSent(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
}

// Driver is what the relay needs of an outbox table.
//
// Every method that takes a Lease changes an event only if the token is the
// event's current one and the event is sending: a relay whose lease was
// taken over cannot mark, fail or release anything.
type Driver interface {
	Admin
	// Claim leases up to req.Limit due events: pending events whose next
	// attempt has come and sending events whose lease expired, oldest due
	// first, each with a fresh fencing token.
	Claim(ctx context.Context, req ClaimRequest) ([]Row, error)
	// MarkSent marks the leased events sent and returns the ids it marked;
	// the others' leases were lost.
	MarkSent(ctx context.Context, ls []Lease) ([]int64, error)
	// Fail records failed publishes and returns the ids it recorded; the
	// others' leases were lost.
	Fail(ctx context.Context, reqs []FailRequest) ([]int64, error)
	// Release gives leased events back (pending, due now, attempts
	// unchanged) and returns how many it released.
	Release(ctx context.Context, ls []Lease) (int64, error)
}

// Writer writes events in the caller's transaction Tx (pgx.Tx, *sql.Tx).
type Writer[Tx any] interface {
	// Write validates every event (see [Prepare]) before it touches tx,
	// then inserts them in one statement. They become visible to the
	// relay when tx commits, and never if it rolls back. An event whose ID
	// is already in the outbox is skipped. A failed statement may abort
	// tx: roll it back on any error.
	Write(ctx context.Context, tx Tx, evs ...Event) error
}

// Backend is an outbox table in one database.
type Backend[Tx any] interface {
	Driver
	Writer[Tx]
}

// CutError bounds an error text to MaxErrorBytes without splitting a UTF-8
// sequence.
func CutError(s string) string { return statetable.CutError(s) }

// ValidateSelect checks a Redrive or Discard selection.
func ValidateSelect(sel Select) error { return statetable.ValidateSelect("outbox", sel) }

// ValidateClaim checks a ClaimRequest.
func ValidateClaim(req ClaimRequest) error {
	return statetable.ValidateClaim("outbox", req.Limit, req.Lease)
}

// ValidatePurge checks PurgeSent's arguments and returns the effective
// limit (def when limit is 0).
func ValidatePurge(olderThan time.Duration, limit, def int) (int, error) {
	if olderThan < 0 || limit < 0 || limit > MaxBatch {
		return 0, fmt.Errorf("%w: outbox: purge: olderThan must not be negative and limit must be 0..%d", idem.ErrInvalidConfig, MaxBatch)
	}
	if limit == 0 {
		return def, nil
	}
	return limit, nil
}

// ListLimit returns the effective limit of a ListRequest, or an error
// (also for an unknown state).
func ListLimit(req ListRequest) (int, error) {
	if _, err := ParseState(string(req.State)); err != nil {
		return 0, err
	}
	return statetable.ListLimit("outbox", req)
}

// StatsInOrder lists every state in [States] order, taking counts from by
// (a state missing from by counts zero). Backends use it for Stats.
func StatsInOrder(by map[State]StateCount) []StateCount { return statetable.StatsInOrder(States(), by) }

// NotFound returns the error Get reports for a missing row.
func NotFound(driver string, what any) error {
	return fmt.Errorf("%s: outbox event %v: %w", driver, what, idem.ErrNotFound)
}

// Finish fills the fields derived from the stored ones: LeaseExpiresAt for
// a sending row. Drivers call it on every scanned row.
func (r *Row) Finish() {
	if r.State == StateSending {
		r.LeaseExpiresAt = r.NextAttemptAt
	}
	if r.Payload == nil {
		r.Payload = []byte{}
	}
}
