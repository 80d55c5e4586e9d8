package idemredis

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/redis/rueidis"
)

// ErrOutOfMemory reports that Redis refused a write because it reached
// maxmemory. The store fails closed: the claim (or completion) did not
// happen and nothing must be processed. The error is also marked
// [idem.Retryable]: nothing was recorded, so a later retry may succeed.
var ErrOutOfMemory = errors.New("idemredis: redis is out of memory (maxmemory reached); refusing to proceed")

// ErrRecordFormat reports a key that holds something this version of the
// store did not write: a value of another Redis type (such as the hash
// records of earlier development versions), another format version, or a
// corrupt record. The store never reads or overwrites it; [Store.Delete]
// removes it.
var ErrRecordFormat = errors.New("idemredis: record in an unknown or corrupt format (not written by this version of idemredis)")

// ErrEvictionPolicy reports, in strict mode, a server whose
// maxmemory-policy may evict keys (or whose policy could not be read).
var ErrEvictionPolicy = errors.New("idemredis: maxmemory-policy is not noeviction; an evicted record lets a duplicate through")

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "idem:"

// tokenFloorTTL is how long the token of a released or deleted record is
// remembered (as a stub in the record's key, see scripts.go). Tokens are microsecond timestamps of the Redis clock (see
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
	// Coalesce bounds how many concurrent claims (or completions) share
	// one script call. Claims that arrive while earlier ones are in flight
	// wait and go out together, which divides the script's fixed cost and
	// the round trips among them; a lone claim goes out at once. Default
	// DefaultCoalesce; 1 sends every claim and completion on its own, which
	// is faster (by up to a third in BenchmarkBatching) when only a handful
	// of callers ever claim at once. Ignored on a cluster client, where every call has one key (a
	// script's keys must share a hash slot).
	Coalesce int
	// ProcessLease is the lease ProcessBatch takes on each fresh message
	// and extends every ProcessLease/3 while its handler runs. Default
	// DefaultProcessLease.
	ProcessLease time.Duration
	// Strict makes Ping fail when a server's maxmemory-policy is not
	// noeviction or cannot be read. Otherwise Ping logs a warning.
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
	strict    bool
	// processLease is Config.ProcessLease.
	processLease time.Duration
	// lease caches the formatted lease of the latest claim: callers almost
	// always pass the same lease, so the hot path formats nothing.
	lease atomic.Pointer[leaseText]
	// claims and completes batch concurrent calls; nil in cluster mode
	// or with Coalesce 1, where each is its own call.
	claims, completes *storekit.Coalescer[*call]
}

var _ idem.Store = (*Store)(nil)

type leaseText struct {
	d  time.Duration
	s  string
	ms int64
}

var (
	claimLua    = rueidis.NewLuaScript(claimScript)
	completeLua = rueidis.NewLuaScript(completeScript)
	extendLua   = rueidis.NewLuaScript(extendScript)
	releaseLua  = rueidis.NewLuaScript(releaseScript)
	deleteLua   = rueidis.NewLuaScript(deleteScript)
)

// New returns a Store over client, which the caller owns and closes. It
// validates cfg and does no I/O: call [Store.Ping] at start-up to check the
// servers and their maxmemory-policy. cfg may be nil.
func New(client rueidis.Client, cfg *Config) (*Store, error) {
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
	if c.ProcessLease <= 0 {
		c.ProcessLease = DefaultProcessLease
	}
	s := &Store{
		processLease: c.ProcessLease,
		client:       client,
		prefix:       c.Prefix,
		maxResult:    c.MaxResultBytes,
		abandonMS:    millis(c.AbandonedRetention),
		floorMS:      millis(tokenFloorTTL),
		logger:       c.Logger,
	}
	if c.Coalesce <= 0 {
		c.Coalesce = DefaultCoalesce
	}
	if client.Mode() != rueidis.ClientModeCluster && c.Coalesce > 1 {
		s.newBatchers(c.Coalesce)
	}
	s.strict = c.Strict
	return s, nil
}

// Ping checks that every node the client knows answers and reads its
// maxmemory-policy: a policy that may evict keys is logged, or with
// [Config.Strict] is an error wrapping [ErrEvictionPolicy] (as is a policy
// that cannot be read).
func (s *Store) Ping(ctx context.Context) error {
	for addr, node := range s.client.Nodes() {
		if err := node.Do(ctx, node.B().Ping().Build()).Error(); err != nil {
			return s.wrap("ping "+addr, err)
		}
	}
	return s.checkEvictionPolicy(ctx, s.strict)
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

// recordKey returns the key of (scope, key): prefix + "{" + digest + "}",
// where digest is the SHA-256 of the length-prefixed pair (the same bytes
// as [idem.FingerprintParts]) in 64 lowercase hex digits. The digest is the
// hash tag, so records spread over all cluster slots and no choice of
// delimiters in scope or key can make two pairs collide. Even two pairs
// that did share a digest would not share a record: the claim script
// compares the scope and key stored in the record with the caller's. It is
// computed in one stack buffer, since every call of every method needs it.
func (s *Store) recordKey(scope, key string) string {
	// Hashed from a small stack buffer, and built in one allocation: this
	// runs on every call, and zeroing a buffer sized for the longest scope
	// and key, then copying the result into a string, was a sixth of
	// Claim's client CPU (profiled in the benchmark report's Redis group).
	var small [256]byte
	b := small[:0]
	if n := 16 + len(scope) + len(key); n > len(small) {
		b = make([]byte, 0, n)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(len(scope)))
	b = append(b, scope...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(key)))
	b = append(b, key...)
	sum := sha256.Sum256(b)
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	var out strings.Builder
	out.Grow(len(s.prefix) + 2 + len(hx))
	out.WriteString(s.prefix)
	out.WriteByte('{')
	out.Write(hx[:])
	out.WriteByte('}')
	return out.String()
}

// RecordKey returns the Redis key that holds the record of (scope, key),
// for operators who want to inspect it with redis-cli.
func (s *Store) RecordKey(scope, key string) string { return s.recordKey(scope, key) }

// identity returns bytes 89.. of a new record (see scripts.go): fingerprint,
// the two lengths, scope and key.
func identity(fp idem.Fingerprint, scope, key string) string {
	b := make([]byte, 0, len(fp)+7+len(scope)+len(key))
	b = append(b, fp[:]...)
	b = appendDigits(b, int64(len(scope)), 4)
	b = appendDigits(b, int64(len(key)), 3)
	b = append(b, scope...)
	b = append(b, key...)
	return string(b)
}

// appendDigits appends n (non-negative) in exactly width decimal digits.
func appendDigits(b []byte, n int64, width int) []byte {
	start := len(b)
	for range width {
		b = append(b, '0')
	}
	for i := len(b) - 1; i >= start && n > 0; i-- {
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return b
}

// tokenText formats a token as the record stores it.
func tokenText(token int64) string { return string(appendDigits(make([]byte, 0, 20), token, 20)) }

// leaseOf formats lease in ms, from the cache when it is the usual lease.
func (s *Store) leaseOf(lease time.Duration) *leaseText {
	if c := s.lease.Load(); c != nil && c.d == lease {
		return c
	}
	c := &leaseText{d: lease, s: millis(lease), ms: ms(lease)}
	s.lease.Store(c)
	return c
}

// Claim implements [idem.Store]. Concurrent claims share script calls (see
// [Config.Coalesce]); each is still atomic on its own key.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := idem.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	lease := s.leaseOf(req.Lease)
	c := &call{key: s.recordKey(req.Scope, req.Key), id: identity(req.Fingerprint, req.Scope, req.Key), lease: lease}
	if s.claims != nil {
		if err := s.claims.Do(ctx, c); err != nil {
			// c may still be in flight: its sender writes c.claim.
			return idem.Claim{}, err
		}
		return c.claim, nil
	}
	s.execClaims(ctx, []*call{c})
	return c.claim, c.Err
}

// MaxBatch bounds the requests of one [Store.ClaimBatch], [Store.CompleteBatch]
// or [Store.ProcessBatch] call, as idempgx.MaxBatch and idemsqlite.MaxBatch
// bound their ProcessBatch. (How many concurrent calls share one script call
// is [Config.Coalesce].)
const MaxBatch = 4096

// BatchClaim is one item of [Store.ClaimBatch]'s answer: the claim, or the
// error of that key alone (a key that holds another type, a record of
// another format, an out-of-memory refusal).
type BatchClaim struct {
	idem.Claim
	Err error
}

// ClaimBatch claims every request of reqs, for a consumer that receives
// messages in batches (a Kafka fetch, a JetStream Fetch). Each key is
// claimed atomically, as by [Store.Claim], and in the order of reqs: the
// same key twice gives the second request InProgress. The answer has one
// item per request, in order.
//
// Requests go out as few script calls as [Config.Coalesce] allows (one key
// per call on a cluster client), with consecutive requests of the same
// lease sharing a call, and all the calls go out together in one round
// trip from the caller's goroutine. It returns an error, and claims
// nothing, when a request is invalid or there are more than
// [MaxBatch]; it returns an error when the calls fail as a whole (the
// server is unreachable, ctx ended), with the answer, whose items of the
// failed calls carry that error: then some keys may still have been
// claimed, and their leases expire as usual, as with a Claim whose context
// ends in flight.
func (s *Store) ClaimBatch(ctx context.Context, reqs []idem.ClaimRequest) ([]BatchClaim, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if err := checkBatch(reqs, "claim", idem.ValidateClaim); err != nil {
		return nil, err
	}
	calls, err := s.claimCalls(ctx, reqs)
	if calls == nil {
		return nil, err
	}
	out := make([]BatchClaim, len(reqs))
	for i := range calls {
		out[i] = BatchClaim{Claim: calls[i].claim, Err: calls[i].Err}
	}
	return out, err
}

// claimCalls claims valid reqs as ClaimBatch does and returns their calls,
// which carry the record keys, or nil and an error when ctx has ended.
func (s *Store) claimCalls(ctx context.Context, reqs []idem.ClaimRequest) ([]call, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, s.wrap("claim", err)
	}
	calls := make([]call, len(reqs))
	ptrs := make([]*call, len(reqs))
	for i, req := range reqs {
		c := &calls[i]
		c.key, c.id, c.lease = s.recordKey(req.Scope, req.Key), identity(req.Fingerprint, req.Scope, req.Key), s.leaseOf(req.Lease)
		ptrs[i] = c
	}
	err := s.execMulti(ctx, claimLua, ptrs, func(first, c *call) bool { return c.lease.ms == first.lease.ms },
		func(cs []*call) rueidis.LuaExec { return claimExec(s, cs) }, s.setClaims)
	return calls, err
}

// checkBatch refuses a batch of more than MaxBatch requests or with
// an invalid one, before anything is sent.
func checkBatch[R any](reqs []R, op string, validate func(R) error) error {
	if err := storekit.ValidateBatch(reqs, MaxBatch, validate); err != nil {
		return fmt.Errorf("idemredis: %s: %w", op, err)
	}
	return nil
}

// tokenOp runs a script that answers 1 (done), 0 (token not current) or
// -1 (record of another format).
func (s *Store) tokenOp(ctx context.Context, op string, script *rueidis.Lua, rk string, token int64, args ...string) error {
	if token <= 0 {
		return fmt.Errorf("idemredis: %s: token %d: %w", op, token, idem.ErrLeaseLost)
	}
	n, err := script.Exec(ctx, s.client, []string{rk}, append([]string{tokenText(token)}, args...)).AsInt64()
	return s.tokenReply(op, rk, token, n, err)
}

// tokenReply turns a script's 1/0/-1 answer (or n > 1 for Extend's lease
// expiry) into an error.
func (s *Store) tokenReply(op, rk string, token, n int64, err error) error {
	switch {
	case err != nil:
		return s.wrap(op, err)
	case n == 0:
		return fmt.Errorf("idemredis: %s: token %d: %w", op, token, idem.ErrLeaseLost)
	case n < 0:
		return fmt.Errorf("idemredis: %s: key %s: %w", op, rk, ErrRecordFormat)
	}
	return nil
}

// completeCall fills c for req, whose record is at rk. A token that no
// claim can have issued is ErrLeaseLost at once.
func (s *Store) completeCall(c *call, rk string, req idem.CompleteRequest) error {
	c.key, c.token, c.result, c.flags, c.retention = rk, req.Token, string(req.Result), "00", millis(req.Retention)
	if c.token <= 0 {
		return fmt.Errorf("idemredis: complete: token %d: %w", c.token, idem.ErrLeaseLost)
	}
	c.tokenText = tokenText(c.token)
	if len(req.Result) > s.maxResult {
		c.result, c.flags = "", "01"
	}
	if req.Failed {
		c.flags = "1" + c.flags[1:]
	}
	return nil
}

// CompleteBatch completes every request of reqs, the counterpart of
// [Store.ClaimBatch]: each record is checked against its own token, as by
// [Store.Complete], and the answer has one error per request, in order (nil
// when that record was completed; ErrLeaseLost when its token is no longer
// current). Requests go out as few script calls as [Config.Coalesce]
// allows, all in one round trip. It returns an error, and completes
// nothing, when a request is invalid or there are more than
// [MaxBatch]; it returns an error when the calls fail as a whole (then
// some records may still have been completed; completing them again with
// the same token is refused, as after any lost reply).
func (s *Store) CompleteBatch(ctx context.Context, reqs []idem.CompleteRequest) ([]error, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if err := checkBatch(reqs, "complete", idem.ValidateComplete); err != nil {
		return nil, err
	}
	if err := context.Cause(ctx); err != nil {
		return nil, s.wrap("complete", err)
	}
	calls := make([]call, len(reqs))
	for i, req := range reqs {
		calls[i].Err = s.completeCall(&calls[i], s.recordKey(req.Scope, req.Key), req)
	}
	err := s.completeCalls(ctx, calls)
	out := make([]error, len(reqs))
	for i := range calls {
		out[i] = calls[i].Err
	}
	return out, err
}

// completeCalls completes the calls that have no error yet, as
// CompleteBatch does, and sets each one's error.
func (s *Store) completeCalls(ctx context.Context, calls []call) error {
	ptrs := make([]*call, 0, len(calls))
	for i := range calls {
		if calls[i].Err == nil {
			ptrs = append(ptrs, &calls[i])
		}
	}
	return s.execMulti(ctx, completeLua, ptrs, func(_, _ *call) bool { return true }, completeExec, s.setCompletes)
}

// Complete implements [idem.Store]. Concurrent completions share script
// calls, as claims do.
func (s *Store) Complete(ctx context.Context, req idem.CompleteRequest) error {
	if err := idem.ValidateComplete(req); err != nil {
		return err
	}
	c := &call{}
	if err := s.completeCall(c, s.recordKey(req.Scope, req.Key), req); err != nil {
		return err
	}
	if s.completes != nil {
		return s.completes.Do(ctx, c)
	}
	s.execCompletes(ctx, []*call{c})
	return c.Err
}

// Release implements [idem.Store].
func (s *Store) Release(ctx context.Context, scope, key string, token int64) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	return s.releaseKey(ctx, s.recordKey(scope, key), token)
}

// releaseKey releases the lease of token on the record at rk.
func (s *Store) releaseKey(ctx context.Context, rk string, token int64) error {
	return s.tokenOp(ctx, "release", releaseLua, rk, token, s.floorMS)
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
	rk := s.recordKey(scope, key)
	le, err := extendLua.Exec(ctx, s.client, []string{rk},
		[]string{tokenText(token), millis(lease), s.abandonMS}).AsInt64()
	if err := s.tokenReply("extend", rk, token, le, err); err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(le), nil
}

// Get implements [idem.Store]. Redis deletes a record the moment its
// retention passes, so Get never sees an expired completed record.
func (s *Store) Get(ctx context.Context, scope, key string) (idem.Record, error) {
	if err := idem.Validate(scope, key); err != nil {
		return idem.Record{}, err
	}
	rk := s.recordKey(scope, key)
	raw, err := s.client.Do(ctx, s.client.B().Get().Key(rk).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return idem.Record{}, fmt.Errorf("idemredis: get: %w", idem.ErrNotFound)
	}
	if err != nil {
		return idem.Record{}, s.wrap("get", err)
	}
	rec, err := parseRecord(raw)
	if err != nil {
		return idem.Record{}, fmt.Errorf("idemredis: get: key %s: %w", rk, err)
	}
	return rec, nil
}

// Delete implements [idem.Store]. The record's token is remembered so that
// the next claim still gets a greater one. A key holding a value of another
// format is deleted too, without a stub.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := idem.Validate(scope, key); err != nil {
		return err
	}
	n, err := deleteLua.Exec(ctx, s.client, []string{s.recordKey(scope, key)}, []string{s.floorMS}).AsInt64()
	if err != nil {
		return s.wrap("delete", err)
	}
	steps, err := s.deleteSteps(ctx, scope, key)
	if err != nil {
		return err
	}
	if n == 0 && !steps {
		return fmt.Errorf("idemredis: delete: %w", idem.ErrNotFound)
	}
	return nil
}

// Purge implements [idem.Store] and returns 0: every record carries a Redis
// expiry (PXAT) equal to its ExpiresAt, so Redis itself removes it, and
// an expired key is invisible to every command from the moment it expires.
// There is never anything left for Purge to delete.
func (s *Store) Purge(ctx context.Context, limit int) (int64, error) {
	if limit < 0 {
		return 0, fmt.Errorf("%w: purge limit must not be negative, got %d", idem.ErrInvalidConfig, limit)
	}
	return 0, ctx.Err()
}

// parseRecord decodes a record in the layout of scripts.go. A stub of a
// removed record is ErrNotFound; anything else that is not a record of
// this format is ErrRecordFormat.
func parseRecord(raw string) (idem.Record, error) {
	if len(raw) < stubLen || raw[0] != formatVersion {
		return idem.Record{}, fmt.Errorf("%w: %d bytes starting %q", ErrRecordFormat, len(raw), raw[:min(len(raw), 4)])
	}
	var rec idem.Record
	switch raw[1] {
	case 'x':
		return idem.Record{}, idem.ErrNotFound
	case 'p':
		rec.State = idem.StateInProgress
	case 'c':
		rec.State = idem.StateCompleted
	default:
		return idem.Record{}, fmt.Errorf("%w: unknown state %q", ErrRecordFormat, raw[1])
	}
	if len(raw) < recordHeaderLen {
		return idem.Record{}, fmt.Errorf("%w: record is %d bytes, shorter than its header", ErrRecordFormat, len(raw))
	}
	var err error
	if rec.Failed, err = parseFlag("failed", raw[2]); err != nil {
		return idem.Record{}, err
	}
	if rec.Tombstone, err = parseFlag("tombstone", raw[3]); err != nil {
		return idem.Record{}, err
	}
	if rec.Token, err = parseDigits("token", raw[4:24]); err != nil {
		return idem.Record{}, err
	}
	for i, dst := range []*time.Time{&rec.CreatedAt, &rec.LeaseExpiresAt, &rec.CompletedAt, &rec.ExpiresAt} {
		ms, err := parseDigits(timeFields[i], raw[24+16*i:40+16*i])
		if err != nil {
			return idem.Record{}, err
		}
		if ms != 0 {
			*dst = time.UnixMilli(ms)
		}
	}
	copy(rec.Fingerprint[:], raw[88:120])
	scopeLen, err1 := parseDigits("scope length", raw[120:124])
	keyLen, err2 := parseDigits("key length", raw[124:127])
	if err := errors.Join(err1, err2); err != nil {
		return idem.Record{}, err
	}
	end := recordHeaderLen + int(scopeLen) + int(keyLen)
	if end > len(raw) {
		return idem.Record{}, fmt.Errorf("%w: scope and key run past the record's end", ErrRecordFormat)
	}
	rec.Scope, rec.Key = raw[recordHeaderLen:recordHeaderLen+int(scopeLen)], raw[recordHeaderLen+int(scopeLen):end]
	if rec.State == idem.StateCompleted && !rec.Tombstone {
		rec.Result = []byte(raw[end:])
	}
	return rec, nil
}

var timeFields = [4]string{"created", "lease expiry", "completed", "expiry"}

// parseDigits reads a fixed-width field of decimal digits.
func parseDigits(field, v string) (int64, error) {
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' || n > (1<<63-1-9)/10 {
			return 0, fmt.Errorf("%w: field %s is %q", ErrRecordFormat, field, v)
		}
		n = n*10 + int64(c-'0')
	}
	return n, nil
}

func parseFlag(field string, c byte) (bool, error) {
	switch c {
	case '0':
		return false, nil
	case '1':
		return true, nil
	}
	return false, fmt.Errorf("%w: field %s is %q", ErrRecordFormat, field, c)
}

// wrap classifies a client error: OOM fails closed with ErrOutOfMemory,
// transient server states and transport errors are marked retryable.
func (s *Store) wrap(op string, err error) error {
	if rerr, ok := rueidis.IsRedisErr(err); ok {
		msg := rerr.Error()
		switch {
		case strings.HasPrefix(msg, "WRONGTYPE") || strings.Contains(msg, "WRONGTYPE Operation"):
			return fmt.Errorf("idemredis: %s: %w: %w", op, ErrRecordFormat, err)
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
func millis(d time.Duration) string { return strconv.FormatInt(ms(d), 10) }

// ms is d in whole milliseconds, rounded up.
func ms(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }
