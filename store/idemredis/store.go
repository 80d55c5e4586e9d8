package idemredis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/rueidis"
)

// ErrOutOfMemory reports that Redis refused a write because it reached
// maxmemory. The store fails closed: the claim (or completion) did not
// happen and nothing must be processed. The error is also marked
// [idem.Retryable]: nothing was recorded, so a later retry may succeed.
var ErrOutOfMemory = errors.New("idemredis: redis is out of memory (maxmemory reached); refusing to proceed")

// ErrEvictionPolicy reports, in strict mode, a server whose
// maxmemory-policy may evict keys (or whose policy could not be read).
var ErrEvictionPolicy = errors.New("idemredis: maxmemory-policy is not noeviction; an evicted record lets a duplicate through")

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "idem:"

// tokenFloorTTL is how long the token of a released or deleted record is
// remembered. Tokens are microsecond timestamps of the Redis clock (see
// doc.go), so the floor only matters if that clock steps backwards; an hour
// covers any step NTP takes.
const tokenFloorTTL = time.Hour

// Config configures a [Store]. A nil *Config means the defaults documented
// on each field.
type Config struct {
	// Prefix starts every key the store writes. Default DefaultPrefix. It
	// must not contain '{' or '}', which would change the cluster hash slot.
	Prefix string
	// MaxResultBytes bounds a stored result; a larger result turns the
	// record into a tombstone. Default idem.DefaultMaxResultBytes.
	MaxResultBytes int
	// AbandonedRetention is how long an in-progress record is kept after its
	// lease expired, so that a late claim still reports a takeover and a
	// late Complete from the original holder still succeeds. After that,
	// Redis deletes the record. Default idem.DefaultRetention.
	AbandonedRetention time.Duration
	// Strict makes New fail when a server's maxmemory-policy is not
	// noeviction or cannot be read. Otherwise New logs a warning.
	Strict bool
	// Logger receives the start-up configuration warnings.
	// Default slog.Default().
	Logger *slog.Logger
}

// Store is an [idem.Store] over Redis or Redis Cluster. It is safe for
// concurrent use; concurrent calls share the client's auto-pipelined
// connections.
type Store struct {
	client    rueidis.Client
	prefix    string
	maxResult int
	abandonMS string
	floorMS   string
	logger    *slog.Logger
}

var _ idem.Store = (*Store)(nil)

var (
	claimLua    = rueidis.NewLuaScript(claimScript)
	completeLua = rueidis.NewLuaScript(completeScript)
	extendLua   = rueidis.NewLuaScript(extendScript)
	releaseLua  = rueidis.NewLuaScript(releaseScript)
	deleteLua   = rueidis.NewLuaScript(deleteScript)
)

// New returns a Store over client, which the caller owns and closes. It
// reads maxmemory-policy from every node the client knows (see
// [Config.Strict]). cfg may be nil.
func New(ctx context.Context, client rueidis.Client, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("idemredis: nil client: %w", idem.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return nil, fmt.Errorf("%w: idemredis: prefix %q must not contain '{' or '}'", idem.ErrInvalidConfig, c.Prefix)
	}
	if c.MaxResultBytes <= 0 {
		c.MaxResultBytes = idem.DefaultMaxResultBytes
	}
	if c.AbandonedRetention <= 0 {
		c.AbandonedRetention = idem.DefaultRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	s := &Store{
		client:    client,
		prefix:    c.Prefix,
		maxResult: c.MaxResultBytes,
		abandonMS: millis(c.AbandonedRetention),
		floorMS:   millis(tokenFloorTTL),
		logger:    c.Logger,
	}
	if err := s.checkEvictionPolicy(ctx, c.Strict); err != nil {
		return nil, err
	}
	return s, nil
}

// Durable reports true: within Redis's own persistence settings the records
// survive a restart. See the durability caveat in the package docs.
func (s *Store) Durable() bool { return true }

// checkEvictionPolicy reads maxmemory-policy on every node. A policy that
// may evict keys would silently drop records, which lets duplicates run.
func (s *Store) checkEvictionPolicy(ctx context.Context, strict bool) error {
	for addr, node := range s.client.Nodes() {
		vals, err := node.Do(ctx, node.B().ConfigGet().Parameter("maxmemory-policy").Build()).AsStrMap()
		policy, ok := vals["maxmemory-policy"]
		switch {
		case err != nil:
			if strict {
				return fmt.Errorf("%w: cannot read it on %s: %v", ErrEvictionPolicy, addr, err)
			}
			s.logger.WarnContext(ctx, "idemredis: cannot read maxmemory-policy; make sure it is noeviction, or evicted records let duplicates through",
				slog.String("node", addr), slog.Any("error", err))
		case !ok || policy != "noeviction":
			if strict {
				return fmt.Errorf("%w: %s has %q", ErrEvictionPolicy, addr, policy)
			}
			s.logger.WarnContext(ctx, "idemredis: maxmemory-policy is not noeviction; an evicted record lets a duplicate through",
				slog.String("node", addr), slog.String("policy", policy))
		}
	}
	return nil
}

// keys returns the record key and the token-floor key of (scope, key). The
// hash of the length-prefixed pair is the hash tag, so the two keys share a
// cluster slot, records spread over all slots, and no choice of delimiters
// in scope or key can make two pairs collide.
func (s *Store) keys(scope, key string) []string {
	sum := idem.FingerprintParts([]byte(scope), []byte(key))
	var b strings.Builder
	b.Grow(len(s.prefix) + 2 + 2*len(sum) + 2)
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteString(hex.EncodeToString(sum[:]))
	b.WriteByte('}')
	rec := b.String()
	return []string{rec, rec + ":f"}
}

// RecordKey returns the Redis key that holds the record of (scope, key),
// for operators who want to inspect it with redis-cli.
func (s *Store) RecordKey(scope, key string) string { return s.keys(scope, key)[0] }

// Claim implements [idem.Store].
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	vals, err := claimLua.Exec(ctx, s.client, s.keys(req.Scope, req.Key),
		[]string{req.Scope, req.Key, string(req.Fingerprint[:]), millis(req.Lease), s.abandonMS}).ToArray()
	if err != nil {
		return idem.Claim{}, s.wrap("claim", err)
	}
	if len(vals) == 0 {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: empty reply")
	}
	code, err := vals[0].AsInt64()
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	outcome := idem.Outcome(code)
	if outcome == idem.Acquired {
		if len(vals) != 4 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: reply has %d elements", len(vals))
		}
		tok, err1 := vals[1].AsInt64()
		le, err2 := vals[2].AsInt64()
		takeover, err3 := vals[3].AsInt64()
		if err := errors.Join(err1, err2, err3); err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		return idem.Claim{Outcome: idem.Acquired, Token: tok, Takeover: takeover == 1, LeaseExpiresAt: time.UnixMilli(le)}, nil
	}
	switch outcome {
	case idem.InProgress, idem.Completed, idem.Mismatch:
	default:
		return idem.Claim{}, fmt.Errorf("idemredis: claim: unknown outcome %d", code)
	}
	rec, err := s.parseRecord(vals[1:])
	if err != nil {
		return idem.Claim{}, err
	}
	return idem.Claim{Outcome: outcome, Record: &rec}, nil
}

// Complete implements [idem.Store].
func (s *Store) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if err := idem.ValidateComplete(req); err != nil {
		return err
	}
	if req.Token <= 0 {
		return fmt.Errorf("idemredis: complete: token %d: %w", req.Token, idem.ErrLeaseLost)
	}
	result, tombstone := string(req.Result), "0"
	if len(req.Result) > s.maxResult {
		result, tombstone = "", "1"
	}
	ok, err := completeLua.Exec(ctx, s.client, s.keys(req.Scope, req.Key),
		[]string{strconv.FormatInt(req.Token, 10), result, flag(req.Failed), tombstone, millis(req.Retention)}).AsInt64()
	if err != nil {
		return s.wrap("complete", err)
	}
	if ok != 1 {
		return fmt.Errorf("idemredis: complete: token %d: %w", req.Token, idem.ErrLeaseLost)
	}
	return nil
}

// Release implements [idem.Store].
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	if token <= 0 {
		return fmt.Errorf("idemredis: release: token %d: %w", token, idem.ErrLeaseLost)
	}
	ok, err := releaseLua.Exec(ctx, s.client, s.keys(scope, key),
		[]string{strconv.FormatInt(token, 10), s.floorMS}).AsInt64()
	if err != nil {
		return s.wrap("release", err)
	}
	if ok != 1 {
		return fmt.Errorf("idemredis: release: token %d: %w", token, idem.ErrLeaseLost)
	}
	return nil
}

// Extend implements [idem.Store].
func (s *Store) Extend(ctx context.Context, scope, key string, token int64, lease time.Duration) (time.Time, error) {
	if err := idem.Validate(scope, key); err != nil {
		return time.Time{}, err
	}
	if lease <= 0 {
		return time.Time{}, fmt.Errorf("%w: lease must be positive, got %v", idem.ErrInvalidConfig, lease)
	}
	if token <= 0 {
		return time.Time{}, fmt.Errorf("idemredis: extend: token %d: %w", token, idem.ErrLeaseLost)
	}
	le, err := extendLua.Exec(ctx, s.client, s.keys(scope, key),
		[]string{strconv.FormatInt(token, 10), millis(lease), s.abandonMS}).AsInt64()
	if err != nil {
		return time.Time{}, s.wrap("extend", err)
	}
	if le == 0 {
		return time.Time{}, fmt.Errorf("idemredis: extend: token %d: %w", token, idem.ErrLeaseLost)
	}
	return time.UnixMilli(le), nil
}

// recordFields is the order in which the scripts and Get read a record.
var recordFields = []string{"s", "k", "st", "fp", "tok", "r", "f", "ts", "ca", "le", "co", "ex"}

// Get implements [idem.Store]. Redis deletes a record the moment its
// retention passes, so Get never sees an expired completed record.
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := idem.Validate(scope, key); err != nil {
		return idem.Record{}, err
	}
	rk := s.keys(scope, key)[0]
	vals, err := s.client.Do(ctx, s.client.B().Hmget().Key(rk).Field(recordFields...).Build()).ToArray()
	if err != nil {
		return idem.Record{}, s.wrap("get", err)
	}
	if len(vals) == len(recordFields) && vals[2].IsNil() {
		return idem.Record{}, fmt.Errorf("idemredis: get: %w", idem.ErrNotFound)
	}
	return s.parseRecord(vals)
}

// Delete implements [idem.Store]. The record's token is remembered so that
// the next claim still gets a greater one.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	ok, err := deleteLua.Exec(ctx, s.client, s.keys(scope, key), []string{s.floorMS}).AsInt64()
	if err != nil {
		return s.wrap("delete", err)
	}
	if ok != 1 {
		return fmt.Errorf("idemredis: delete: %w", idem.ErrNotFound)
	}
	return nil
}

// Purge implements [idem.Store] and returns 0: every record carries a Redis
// expiry (PEXPIREAT) equal to its ExpiresAt, so Redis itself removes it, and
// an expired key is invisible to every command from the moment it expires.
// There is never anything left for Purge to delete.
func (s *Store) Purge(ctx context.Context, limit int) (int64, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: purge limit must not be negative, got %d", idem.ErrInvalidConfig, limit)
	}
	return 0, ctx.Err()
}

// parseRecord decodes the recordFields values of one record.
func (s *Store) parseRecord(vals []rueidis.RedisMessage) (idem.Record, error) {
	if len(vals) != len(recordFields) {
		return idem.Record{}, fmt.Errorf("idemredis: record reply has %d fields, want %d", len(vals), len(recordFields))
	}
	str := make([]string, len(vals))
	for i := range vals {
		if vals[i].IsNil() {
			continue
		}
		v, err := vals[i].ToString()
		if err != nil {
			return idem.Record{}, fmt.Errorf("idemredis: record field %s: %w", recordFields[i], err)
		}
		str[i] = v
	}
	// A record can vanish between the script's reads only if it expired or
	// was deleted, which the state field tells.
	if str[2] == "" {
		return idem.Record{}, fmt.Errorf("idemredis: %w", idem.ErrNotFound)
	}
	var rec idem.Record
	rec.Scope, rec.Key = str[0], str[1]
	switch str[2] {
	case "p":
		rec.State = idem.StateInProgress
	case "c":
		rec.State = idem.StateCompleted
	default:
		return idem.Record{}, fmt.Errorf("idemredis: record has unknown state %q", str[2])
	}
	if len(str[3]) != len(rec.Fingerprint) {
		return idem.Record{}, fmt.Errorf("idemredis: record fingerprint is %d bytes", len(str[3]))
	}
	copy(rec.Fingerprint[:], str[3])
	rec.Failed = str[6] == "1"
	rec.Tombstone = str[7] == "1"
	if rec.State == idem.StateCompleted && !rec.Tombstone {
		rec.Result = []byte(str[5])
	}
	var err error
	if rec.Token, err = parseInt("tok", str[4]); err != nil {
		return idem.Record{}, err
	}
	for i, dst := range []*time.Time{&rec.CreatedAt, &rec.LeaseExpiresAt, &rec.CompletedAt, &rec.ExpiresAt} {
		name, v := recordFields[8+i], str[8+i]
		if v == "" {
			continue
		}
		ms, err := parseInt(name, v)
		if err != nil {
			return idem.Record{}, err
		}
		*dst = time.UnixMilli(ms)
	}
	return rec, nil
}

func parseInt(field, v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("idemredis: record field %s: %w", field, err)
	}
	return n, nil
}

// wrap classifies a client error: OOM fails closed with ErrOutOfMemory,
// transient server states and transport errors are marked retryable.
func (s *Store) wrap(op string, err error) error {
	if rerr, ok := rueidis.IsRedisErr(err); ok {
		msg := rerr.Error()
		switch {
		case strings.HasPrefix(msg, "OOM") || strings.Contains(msg, "OOM command not allowed"):
			return idem.Retryable(fmt.Errorf("idemredis: %s: %w: %w", op, ErrOutOfMemory, err))
		case rerr.IsLoading(), rerr.IsTryAgain(), rerr.IsClusterDown(), strings.HasPrefix(msg, "BUSY"),
			strings.HasPrefix(msg, "MASTERDOWN"), strings.HasPrefix(msg, "READONLY"):
			return idem.Retryable(fmt.Errorf("idemredis: %s: %w", op, err))
		}
		return fmt.Errorf("idemredis: %s: %w", op, err)
	}
	return idem.Retryable(fmt.Errorf("idemredis: %s: %w", op, err))
}

// millis rounds d up to whole milliseconds, so a positive duration never
// becomes an immediate expiry.
func millis(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10)
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
