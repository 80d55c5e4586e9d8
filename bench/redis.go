package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// RedisCallers is the concurrency of the Redis scenarios.
const RedisCallers = 64

// RedisPipeline is the depth of the pipelined ceiling.
const RedisPipeline = 16

// RedisBenchmarkCeiling names the row of redis-benchmark's pipelined SET NX
// PX, the ceiling the Redis target is set against.
const RedisBenchmarkCeiling = "redis-benchmark -P 16 SET NX PX"

// RedisClaimBatch names the row of idem claims made 16 at a time.
const RedisClaimBatch = "idem Store.ClaimBatch ×16 (rueidis)"

// redisTTL bounds every key the Redis scenarios write, so nothing outlives
// the run for long.
const redisTTL = time.Minute

func redisScenarios(n int) []*Scenario {
	row := func(name string, role Role, note string, prep func(context.Context, *Env, *Scenario) (Run, error)) *Scenario {
		return &Scenario{Group: GroupRedis, Name: name, Role: role, Concurrency: RedisCallers, Messages: n,
			Note: note, Needs: NeedsRedis, Prepare: prep}
	}
	return []*Scenario{
		row(RedisBenchmarkCeiling, RoleCeiling, "the issue's ceiling: C client, 64 connections, random fresh keys", prepRedisBenchmark),
		row(fmt.Sprintf("raw SET NX PX, go-redis pipeline ×%d", RedisPipeline), RoleCeiling, "no record, no token, no fingerprint", prepRedisCeiling),
		row("raw SET NX PX, go-redis unpipelined", RoleTextbook, "one round trip per key", prepRedisTextbook),
		row("raw SET NX PX, rueidis, one per caller", RoleTextbook, "the bare command from the same 64 callers, auto-pipelined", prepRedisRueidis),
		row("idem Store.Claim (rueidis)", RoleIdem, "Lua claim: record, fencing token, fingerprint", prepRedisClaim),
		row(RedisClaimBatch, RoleIdem, "the same claim, 16 keys per ClaimBatch: the ceiling's 16 in flight per caller", prepRedisClaimBatch),
		row("idem ClaimBatch + CompleteBatch ×16", RoleIdem, "the whole lease cycle, 16 keys per call", prepRedisCycleBatch),
		row("idem Store.Claim + Complete", RoleIdem, "the whole lease cycle: claim, then store a result", prepRedisClaimComplete),
	}
}

func goRedis(env *Env) (*redis.Client, error) {
	return sharedValue(env, "go-redis", func() (*redis.Client, error) {
		opt, err := redis.ParseURL(env.RedisURL)
		if err != nil {
			return nil, err
		}
		opt.PoolSize = RedisCallers
		c := redis.NewClient(opt)
		env.Cleanup(func() { _ = c.Close() })
		return c, nil
	})
}

func prepRedisCeiling(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	c, err := goRedis(env)
	if err != nil {
		return Run{}, err
	}
	return Run{After: unlinkAfter(c, func(k string) string { return "idembench:" + k }), Exec: func(ctx context.Context, st Stream) error {
		return eachBatch(ctx, s.Concurrency, len(st.Keys), RedisPipeline, func(ctx context.Context, _, lo, hi int) error {
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range st.Keys[lo:hi] {
					p.SetNX(ctx, "idembench:"+k, "1", redisTTL)
				}
				return nil
			})
			return err
		})
	}}, nil
}

func prepRedisTextbook(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	c, err := goRedis(env)
	if err != nil {
		return Run{}, err
	}
	return Run{After: unlinkAfter(c, func(k string) string { return "idembench:" + k }), Exec: func(ctx context.Context, st Stream) error {
		return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, _, i int) error {
			return c.SetNX(ctx, "idembench:"+st.Keys[i], "1", redisTTL).Err()
		})
	}}, nil
}

// rueidisClient returns the run's rueidis client, opened once.
func rueidisClient(env *Env) (rueidis.Client, error) {
	return sharedValue(env, "rueidis", func() (rueidis.Client, error) {
		opt, err := rueidis.ParseURL(env.RedisURL)
		if err != nil {
			return nil, err
		}
		c, err := rueidis.NewClient(opt)
		if err != nil {
			return nil, err
		}
		env.Cleanup(c.Close)
		return c, nil
	})
}

func prepRedisRueidis(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	c, err := rueidisClient(env)
	if err != nil {
		return Run{}, err
	}
	gr, err := goRedis(env)
	if err != nil {
		return Run{}, err
	}
	ttl := redisTTL.Milliseconds()
	return Run{After: unlinkAfter(gr, func(k string) string { return "idembench:" + k }), Exec: func(ctx context.Context, st Stream) error {
		return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, _, i int) error {
			return c.Do(ctx, c.B().Set().Key("idembench:"+st.Keys[i]).Value("1").Nx().PxMilliseconds(ttl).Build()).Error()
		})
	}}, nil
}

func prepRedisClaim(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	return prepRedisStore(ctx, env, s, false)
}

func prepRedisClaimComplete(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	return prepRedisStore(ctx, env, s, true)
}

// prepRedisStore claims every key of the stream through the store, and
// with complete stores a small result for each.
func prepRedisStore(ctx context.Context, env *Env, s *Scenario, complete bool) (Run, error) {
	store, gr, err := redisStore(ctx, env)
	if err != nil {
		return Run{}, err
	}
	return Run{After: unlinkAfter(gr, func(k string) string { return store.RecordKey("bench", k) }), Exec: func(ctx context.Context, st Stream) error {
		return eachMessage(ctx, s.Concurrency, len(st.Keys), func(ctx context.Context, _, i int) error {
			c, err := store.Claim(ctx, idem.ClaimRequest{Scope: "bench", Key: st.Keys[i], Lease: redisTTL})
			if err == nil && c.Outcome != idem.Acquired {
				err = fmt.Errorf("claim %q: %v, want acquired", st.Keys[i], c.Outcome)
			}
			if err == nil && complete {
				err = store.Complete(ctx, idem.CompleteRequest{Scope: "bench", Key: st.Keys[i], Token: c.Token, Result: []byte("ok"), Retention: redisTTL})
			}
			return err
		})
	}}, nil
}

func prepRedisClaimBatch(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	return prepRedisBatches(ctx, env, s, false)
}

func prepRedisCycleBatch(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	return prepRedisBatches(ctx, env, s, true)
}

// prepRedisBatches claims the stream's keys RedisPipeline at a time with
// Store.ClaimBatch, the in-flight depth of the pipelined ceiling, and with
// complete stores a small result for each with Store.CompleteBatch.
func prepRedisBatches(ctx context.Context, env *Env, s *Scenario, complete bool) (Run, error) {
	store, gr, err := redisStore(ctx, env)
	if err != nil {
		return Run{}, err
	}
	return Run{After: unlinkAfter(gr, func(k string) string { return store.RecordKey("bench", k) }), Exec: func(ctx context.Context, st Stream) error {
		return eachBatch(ctx, s.Concurrency, len(st.Keys), RedisPipeline, func(ctx context.Context, _, lo, hi int) error {
			reqs := make([]idem.ClaimRequest, 0, hi-lo)
			for _, k := range st.Keys[lo:hi] {
				reqs = append(reqs, idem.ClaimRequest{Scope: "bench", Key: k, Lease: redisTTL})
			}
			got, err := store.ClaimBatch(ctx, reqs)
			if err != nil {
				return err
			}
			for i, it := range got {
				if it.Err != nil {
					return it.Err
				}
				if it.Outcome != idem.Acquired {
					return fmt.Errorf("claim %q: %v, want acquired", reqs[i].Key, it.Outcome)
				}
			}
			if !complete {
				return nil
			}
			done := make([]idem.CompleteRequest, len(got))
			for i, it := range got {
				done[i] = idem.CompleteRequest{Scope: "bench", Key: reqs[i].Key, Token: it.Token, Result: []byte("ok"), Retention: redisTTL}
			}
			errs, err := store.CompleteBatch(ctx, done)
			if err == nil {
				err = errors.Join(errs...)
			}
			return err
		})
	}}, nil
}

// redisStore opens the run's store over the shared rueidis client, and
// the go-redis client that unlinks its keys.
func redisStore(ctx context.Context, env *Env) (*idemredis.Store, *redis.Client, error) {
	client, err := rueidisClient(env)
	if err != nil {
		return nil, nil, err
	}
	store, err := idemredis.New(client, &idemredis.Config{Prefix: "idembench:" + env.Prefix + ":", AbandonedRetention: redisTTL})
	if err == nil {
		err = store.Ping(ctx)
	}
	if err != nil {
		return nil, nil, err
	}
	gr, err := goRedis(env)
	return store, gr, err
}

// unlinkAfter returns a Run.After that deletes the keys a run wrote, named
// by key, so that no run pays for the expiry of an earlier run's keys and
// every run starts from the same keyspace.
func unlinkAfter(c *redis.Client, key func(string) string) func(context.Context, Stream) error {
	return func(ctx context.Context, st Stream) error {
		const chunk = 1000
		keys := make([]string, 0, chunk)
		seen := make(map[string]bool, st.Distinct)
		flush := func() error {
			if len(keys) == 0 {
				return nil
			}
			err := c.Unlink(ctx, keys...).Err()
			keys = keys[:0]
			return err
		}
		for _, k := range st.Keys {
			if seen[k] {
				continue
			}
			seen[k] = true
			if keys = append(keys, key(k)); len(keys) == chunk {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return flush()
	}
}

// prepRedisBenchmark runs redis-benchmark (from redis-tools, installed with
// the server) with one connection per caller, 16 commands pipelined on
// each, over as many SET NX PX of random fresh keys as the stream has
// deliveries, and reports the rate it measured itself. Its keys share a
// per-run prefix, unlinked after the run.
func prepRedisBenchmark(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return Run{}, fmt.Errorf("redis-benchmark not found (it ships with the Redis server, Debian package redis-tools): %w", err)
	}
	opt, err := redis.ParseURL(env.RedisURL)
	if err != nil {
		return Run{}, err
	}
	host, port, err := net.SplitHostPort(opt.Addr)
	if err != nil {
		return Run{}, err
	}
	c, err := goRedis(env)
	if err != nil {
		return Run{}, err
	}
	var prefix string
	return Run{
		Rate: func(ctx context.Context, st Stream) (float64, error) {
			prefix = "idembench:" + env.Prefix + ":rb" + randomSuffix() + ":"
			args := []string{"-h", host, "-p", port, "--csv", "-c", strconv.Itoa(s.Concurrency), "-n", strconv.Itoa(len(st.Keys)),
				"-P", strconv.Itoa(RedisPipeline), "-r", "1000000000", "SET", prefix + "__rand_int__", "1", "NX", "PX", strconv.FormatInt(redisTTL.Milliseconds(), 10)}
			if opt.Password != "" {
				args = append(args, "-a", opt.Password)
			}
			if opt.DB != 0 {
				args = append(args, "--dbnum", strconv.Itoa(opt.DB))
			}
			out, err := exec.CommandContext(ctx, bin, args...).Output()
			if err != nil {
				return 0, fmt.Errorf("redis-benchmark: %w", err)
			}
			// --csv prints a header and one line per test: "name","rps",...
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			fields := strings.Split(lines[len(lines)-1], ",")
			if len(fields) < 2 {
				return 0, fmt.Errorf("redis-benchmark printed %q", out)
			}
			rps, err := strconv.ParseFloat(strings.Trim(fields[1], `"`), 64)
			if err != nil || rps <= 0 {
				return 0, fmt.Errorf("redis-benchmark printed %q", out)
			}
			return rps, nil
		},
		After: func(ctx context.Context, _ Stream) error {
			return unlinkPrefix(ctx, c, prefix)
		},
	}, nil
}

// unlinkPrefix deletes every key that starts with prefix.
func unlinkPrefix(ctx context.Context, c *redis.Client, prefix string) error {
	iter := c.Scan(ctx, 0, prefix+"*", 10000).Iterator()
	keys := make([]string, 0, 1000)
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == cap(keys) {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				return err
			}
			keys = keys[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) > 0 {
		return c.Unlink(ctx, keys...).Err()
	}
	return nil
}
