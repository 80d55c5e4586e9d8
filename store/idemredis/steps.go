package idemredis

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/rueidis"
)

var _ idem.StepStore = (*Store)(nil)

// The steps of an operation (idem.Steps) are one Redis hash beside its
// record, at prefix + "steps:" + "{digest}": the same hash tag, so record
// and steps share a cluster slot and one script sees both, and a key that
// a listing's SCAN of prefix + "{*" never returns. Fields:
//
//	!fp      the fingerprint of the record that recorded the first step
//	!seq     the Seq of the latest step
//	!ex      the hash's expiry, ms since the epoch (also its PXAT)
//	<name>   a step: Seq (4 digits), tombstone (0|1), token (20 digits),
//	         created (ms, 16 digits), then the result
//
// Step names never start with '!'. The whole hash expires at once, and
// each step write moves its expiry to now + retention, so Redis purges the
// steps by itself; Release and a takeover leave it alone, Delete removes it.
const stepHeaderLen = 4 + 1 + 20 + 16

// recordStepScript: KEYS[1] the record, KEYS[2] its steps; ARGV[1] token
// (20 digits), ARGV[2] name, ARGV[3] result, ARGV[4] tombstone (0|1),
// ARGV[5] retention ms, ARGV[6] the most steps an operation may have.
// Returns {1, seq, now, expiry}; {0} when the token is not the current
// token of a record in progress; {-1} for a record of another format; {2}
// when the steps belong to another fingerprint, {3} when the step is
// recorded, {4} when the operation has the most steps already.
const recordStepScript = `
local cur = redis.call('GET', KEYS[1])
if not cur then return {0} end
if #cur < 24 or string.byte(cur, 1) ~= 49 then return {-1} end
if string.sub(cur, 2, 2) ~= 'p' or string.sub(cur, 5, 24) ~= ARGV[1] then return {0} end
if #cur < 127 then return {-1} end
local fp = string.sub(cur, 89, 120)
local sfp = redis.call('HGET', KEYS[2], '!fp')
if sfp and sfp ~= fp then return {2} end
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 1 then return {3} end
local n = redis.call('HLEN', KEYS[2])
if n > 3 then n = n - 3 else n = 0 end
if n >= tonumber(ARGV[6]) then return {4} end
local seq = tonumber(redis.call('HGET', KEYS[2], '!seq') or '0') + 1
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ex = now + tonumber(ARGV[5])
redis.call('HSET', KEYS[2], '!fp', fp, '!seq', seq, '!ex', string.format('%.0f', ex),
  ARGV[2], string.format('%04d', seq) .. ARGV[4] .. ARGV[1] .. string.format('%016.0f', now) .. ARGV[3])
redis.call('PEXPIREAT', KEYS[2], string.format('%.0f', ex))
return {1, seq, now, ex}
`

var recordStepLua = rueidis.NewLuaScript(recordStepScript)

// stepsKey is the key of the steps of (scope, key).
func (s *Store) stepsKey(scope, key string) string {
	return s.prefix + "steps:" + strings.TrimPrefix(s.recordKey(scope, key), s.prefix)
}

// RecordStep implements idem.StepStore: one script checks the record's
// token and adds the step, so a takeover's claim (also one script) comes
// entirely before or after it.
func (s *Store) RecordStep(ctx context.Context, req idem.StepRequest) (idem.StepRecord, error) {
	if err := idem.ValidateStep(req); err != nil {
		return idem.StepRecord{}, err
	}
	if req.Token <= 0 {
		return idem.StepRecord{}, fmt.Errorf("idemredis: record step: token %d: %w", req.Token, idem.ErrLeaseLost)
	}
	rk := s.recordKey(req.Scope, req.Key)
	tomb := "0"
	if req.Tombstone {
		tomb = "1"
	}
	out, err := recordStepLua.Exec(ctx, s.client, []string{rk, s.stepsKey(req.Scope, req.Key)},
		[]string{tokenText(req.Token), req.Name, string(req.Result), tomb, millis(req.Retention), strconv.Itoa(idem.MaxSteps)}).AsIntSlice()
	if err != nil {
		return idem.StepRecord{}, s.wrap("record step", err)
	}
	switch {
	case len(out) == 0:
		return idem.StepRecord{}, fmt.Errorf("idemredis: record step: empty reply")
	case out[0] == 0:
		return idem.StepRecord{}, fmt.Errorf("idemredis: record step %q: token %d: %w", req.Name, req.Token, idem.ErrLeaseLost)
	case out[0] == -1:
		return idem.StepRecord{}, fmt.Errorf("idemredis: record step: key %s: %w", rk, ErrRecordFormat)
	case out[0] == 2:
		return idem.StepRecord{}, idem.StepsOfOtherPayload(req.Scope, req.Key)
	case out[0] == 3:
		return idem.StepRecord{}, idem.StepAlreadyRecorded(req.Scope, req.Key, req.Name)
	case out[0] == 4:
		return idem.StepRecord{}, idem.TooManySteps(req.Scope, req.Key, req.Name)
	case out[0] != 1 || len(out) != 4:
		return idem.StepRecord{}, fmt.Errorf("idemredis: record step: unexpected reply %v", out)
	}
	// The fingerprint is the record's: read back with the steps.
	recs, err := s.Steps(ctx, req.Scope, req.Key)
	if err != nil {
		return idem.StepRecord{}, err
	}
	for _, r := range recs {
		if r.Name == req.Name && r.Token == req.Token {
			return r, nil
		}
	}
	return idem.StepRecord{}, fmt.Errorf("idemredis: record step %q: the step expired or was deleted right after it was written", req.Name)
}

// Steps implements idem.StepStore.
func (s *Store) Steps(ctx context.Context, scope, key string) ([]idem.StepRecord, error) {
	if err := idem.Validate(scope, key); err != nil {
		return nil, err
	}
	sk := s.stepsKey(scope, key)
	fields, err := s.client.Do(ctx, s.client.B().Hgetall().Key(sk).Build()).AsStrMap()
	if err != nil {
		return nil, s.wrap("steps", err)
	}
	out := []idem.StepRecord{}
	if len(fields) == 0 {
		return out, nil
	}
	fp, exText := fields["!fp"], fields["!ex"]
	ex, err := strconv.ParseInt(exText, 10, 64)
	if len(fp) != len(idem.Fingerprint{}) || err != nil {
		return nil, fmt.Errorf("idemredis: steps: key %s: %w: bad !fp or !ex", sk, ErrRecordFormat)
	}
	for name, v := range fields {
		if strings.HasPrefix(name, "!") {
			continue
		}
		r, err := parseStep(v)
		if err != nil {
			return nil, fmt.Errorf("idemredis: steps: key %s, step %q: %w", sk, name, err)
		}
		r.Scope, r.Key, r.Name, r.ExpiresAt = scope, key, name, time.UnixMilli(ex)
		copy(r.Fingerprint[:], fp)
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// parseStep decodes a step field's value (see the layout above).
func parseStep(v string) (idem.StepRecord, error) {
	var r idem.StepRecord
	if len(v) < stepHeaderLen {
		return r, fmt.Errorf("%w: step is %d bytes, shorter than its header", ErrRecordFormat, len(v))
	}
	seq, err := parseDigits("seq", v[0:4])
	if err != nil {
		return r, err
	}
	if r.Tombstone, err = parseFlag("tombstone", v[4]); err != nil {
		return r, err
	}
	if r.Token, err = parseDigits("token", v[5:25]); err != nil {
		return r, err
	}
	created, err := parseDigits("created", v[25:41])
	if err != nil {
		return r, err
	}
	r.Seq, r.CreatedAt = int(seq), time.UnixMilli(created)
	if !r.Tombstone {
		r.Result = []byte(v[stepHeaderLen:])
	}
	return r, nil
}

// deleteSteps removes the steps of (scope, key) and reports whether there
// were any. Delete calls it after the record's script: a step write after
// that finds no lease, so nothing is left behind.
func (s *Store) deleteSteps(ctx context.Context, scope, key string) (bool, error) {
	n, err := s.client.Do(ctx, s.client.B().Del().Key(s.stepsKey(scope, key)).Build()).AsInt64()
	if err != nil {
		return false, s.wrap("delete steps", err)
	}
	return n > 0, nil
}
