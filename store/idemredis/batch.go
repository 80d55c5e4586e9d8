package idemredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/storekit"
	"github.com/redis/rueidis"
)

// DefaultCoalesce is the default of [Config.Coalesce].
const DefaultCoalesce = 64

// callsInFlight is how many script calls of one kind (claims, or
// completions) a store keeps in flight at once on a standalone or sentinel
// client. Two keep Redis busy while the previous reply travels back and is
// decoded; more split the same callers into smaller calls, each paying the
// script's fixed cost.
const callsInFlight = 2

// releaseAbandonedTimeout bounds the Release of a lease whose caller gave
// up while its claim was in flight.
const releaseAbandonedTimeout = 5 * time.Second

// call is one Store.Claim or Store.Complete on its way to Redis.
type call struct {
	storekit.Pending
	key string // the record's Redis key

	// Claim.
	id    string // identity (see scripts.go)
	lease *leaseText
	claim idem.Claim

	// Complete.
	token     int64
	tokenText string
	result    string
	flags     string // failed and tombstone, two bytes of 0|1
	retention string // ms
}

// newBatchers sets up the store's claim and completion batchers: concurrent
// claims (of one lease length) and completions each share script calls,
// see [storekit.Coalescer].
func (s *Store) newBatchers(maxBatch int) {
	s.claims = &storekit.Coalescer[*call]{MaxBatch: maxBatch, InFlight: callsInFlight, Exec: s.execClaims,
		Fits:      func(first, c *call) bool { return c.lease.ms == first.lease.ms },
		Abandoned: s.releaseAbandoned,
		Wrap:      func(err error) error { return s.wrap("claim", err) }}
	s.completes = &storekit.Coalescer[*call]{MaxBatch: maxBatch, InFlight: callsInFlight, Exec: s.execCompletes,
		Wrap: func(err error) error { return s.wrap("complete", err) }}
}

// releaseAbandoned releases the lease of a claim whose caller stopped
// waiting while the claim was in flight, so that the key does not stay in
// progress until the lease expires. If the release fails, the lease
// expires as usual.
func (s *Store) releaseAbandoned(c *call) {
	if c.claim.Outcome != idem.Acquired {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Context()), releaseAbandonedTimeout)
	defer cancel()
	_ = s.releaseKey(ctx, c.key, c.claim.Token)
}

// execCompletes runs the completion script once for calls and sets each
// call's error.
func (s *Store) execCompletes(ctx context.Context, calls []*call) {
	e := completeExec(calls)
	_ = s.setCompletes(calls, completeLua.Exec(ctx, s.client, e.Keys, e.Args))
}

// completeExec returns the completion script's keys and arguments for
// calls.
func completeExec(calls []*call) rueidis.LuaExec {
	keys := make([]string, len(calls))
	args := make([]string, 0, 4*len(calls))
	for i, c := range calls {
		keys[i] = c.key
		args = append(args, c.tokenText, c.result, c.flags, c.retention)
	}
	return rueidis.LuaExec{Keys: keys, Args: args}
}

// setCompletes decodes the completion script's reply for calls (1 when all
// were completed, else one item per call) and sets each call's error. It returns the error of the call as a whole, if it
// failed (then every call has it).
func (s *Store) setCompletes(calls []*call, reply rueidis.RedisResult) error {
	if n, err := reply.AsInt64(); err == nil {
		// Every record was completed.
		if n != 1 {
			return storekit.Fail(calls, s.wrap("complete", fmt.Errorf("unknown reply %d", n)))
		}
		for _, c := range calls {
			c.Err = nil
		}
		return nil
	}
	vals, err := reply.ToArray()
	if err == nil && len(vals) != len(calls) {
		err = fmt.Errorf("reply has %d elements, want %d", len(vals), len(calls))
	}
	if err != nil {
		return storekit.Fail(calls, s.wrap("complete", err))
	}
	for i, c := range calls {
		if ierr := vals[i].Error(); ierr != nil {
			c.Err = s.wrap("complete", ierr)
			continue
		}
		n, ierr := vals[i].AsInt64()
		c.Err = s.tokenReply("complete", c.key, c.token, n, ierr)
	}
	return nil
}

// execMulti sends calls as script calls of up to the store's batch size,
// consecutive calls that fit together sharing one, all in one round trip
// from the caller's goroutine, and sets each call's outcome. It returns the
// first error of a script call as a whole.
func (s *Store) execMulti(ctx context.Context, script *rueidis.Lua, calls []*call, fits func(first, c *call) bool,
	build func([]*call) rueidis.LuaExec, set func([]*call, rueidis.RedisResult) error) error {
	if len(calls) == 0 {
		return nil
	}
	per := 1
	if s.claims != nil {
		per = s.claims.MaxBatch
	}
	var chunks [][]*call
	for _, c := range calls {
		if n := len(chunks); n > 0 && len(chunks[n-1]) < per && fits(chunks[n-1][0], c) {
			chunks[n-1] = append(chunks[n-1], c)
			continue
		}
		chunks = append(chunks, []*call{c})
	}
	execs := make([]rueidis.LuaExec, len(chunks))
	for i, chunk := range chunks {
		execs[i] = build(chunk)
	}
	var first error
	for i, reply := range script.ExecMulti(ctx, s.client, execs...) {
		if err := set(chunks[i], reply); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// execClaims runs the claim script once for calls, which share a lease, and
// sets each call's claim or error.
func (s *Store) execClaims(ctx context.Context, calls []*call) {
	e := claimExec(s, calls)
	_ = s.setClaims(calls, claimLua.Exec(ctx, s.client, e.Keys, e.Args))
}

// claimExec returns the claim script's keys and arguments for calls, which
// share a lease.
func claimExec(s *Store, calls []*call) rueidis.LuaExec {
	keys := make([]string, len(calls))
	args := make([]string, 2, 2+len(calls))
	args[0], args[1] = s.abandonMS, calls[0].lease.s
	for i, c := range calls {
		keys[i] = c.key
		args = append(args, c.id)
	}
	return rueidis.LuaExec{Keys: keys, Args: args}
}

// setClaims decodes the claim script's reply for calls (the token alone
// when every claim was fresh, else the token, the time and one item per
// call) and sets each call's claim or error. It returns the error of the call as a whole, if it failed
// (then every call has it).
func (s *Store) setClaims(calls []*call, reply rueidis.RedisResult) error {
	if token, err := reply.AsInt64(); err == nil {
		// Every item was a fresh claim with this token.
		if token <= 0 {
			return storekit.Fail(calls, s.wrap("claim", fmt.Errorf("unknown reply %d", token)))
		}
		for _, c := range calls {
			c.claim, c.Err = freshClaim(c, token, token/1000), nil
		}
		return nil
	}
	vals, err := reply.ToArray()
	if err == nil && len(vals) != 2+len(calls) {
		err = fmt.Errorf("reply has %d elements, want %d", len(vals), 2+len(calls))
	}
	var token, now int64
	if err == nil {
		var err1, err2 error
		token, err1 = vals[0].AsInt64()
		now, err2 = vals[1].AsInt64()
		err = errors.Join(err1, err2)
	}
	if err != nil {
		return storekit.Fail(calls, s.wrap("claim", err))
	}
	for i, c := range calls {
		c.claim, c.Err = s.decodeClaim(c, token, now, &vals[i+2])
	}
	return nil
}

// decodeClaim decodes one item of the claim script's reply.
func (s *Store) decodeClaim(c *call, token, now int64, item *rueidis.RedisMessage) (idem.Claim, error) {
	if item.IsInt64() {
		if n, _ := item.AsInt64(); n != 1 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: unknown item %d", n)
		}
		return freshClaim(c, token, now), nil
	}
	if err := item.Error(); err != nil {
		return idem.Claim{}, s.wrap("claim", err)
	}
	vals, err := item.ToArray()
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	if len(vals) == 0 {
		return idem.Claim{}, errors.New("idemredis: claim: empty item")
	}
	code, err := vals[0].AsInt64()
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	switch outcome := claimOutcome(code); outcome {
	case idem.Acquired:
		if len(vals) != 4 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: item has %d elements", len(vals))
		}
		tok, err1 := vals[1].AsInt64()
		le, err2 := vals[2].AsInt64()
		takeover, err3 := vals[3].AsInt64()
		if err := errors.Join(err1, err2, err3); err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		return idem.Claim{Outcome: idem.Acquired, Token: tok, Takeover: takeover == 1, LeaseExpiresAt: time.UnixMilli(le)}, nil
	case idem.InProgress, idem.Completed, idem.Mismatch:
		if len(vals) != 2 {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: item has %d elements", len(vals))
		}
		raw, err := vals[1].ToString()
		if err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		rec, err := parseRecord(raw)
		if err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		return idem.Claim{Outcome: outcome, Record: &rec}, nil
	case "":
		if code != 0 {
			break
		}
		return idem.Claim{}, fmt.Errorf("idemredis: claim: key %s: %w", c.key, ErrRecordFormat)
	}
	return idem.Claim{}, fmt.Errorf("idemredis: claim: unknown outcome %d", code)
}

// freshClaim is the claim of c acquired by SET NX with token at now (ms).
func freshClaim(c *call, token, now int64) idem.Claim {
	return idem.Claim{Outcome: idem.Acquired, Token: token, LeaseExpiresAt: time.UnixMilli(now + c.lease.ms)}
}

// claimOutcome maps the claim script's result codes (1 acquired, 2 in
// progress, 3 completed, 4 mismatch; 0 an unreadable record) to outcomes.
func claimOutcome(code int64) idem.Outcome {
	switch code {
	case 1:
		return idem.Acquired
	case 2:
		return idem.InProgress
	case 3:
		return idem.Completed
	case 4:
		return idem.Mismatch
	}
	return ""
}
