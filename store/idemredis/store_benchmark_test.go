package idemredis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// callers is the number of concurrent callers in every Go-side benchmark.
const callers = 64

// runCallers runs fn from exactly `callers` goroutines and reports ops/s.
func runCallers(b *testing.B, fn func(i int64) error) { runN(b, callers, fn) }

// runN runs fn b.N times from exactly n goroutines, each call with its own
// i from 1, and reports ops/s.
func runN(b *testing.B, n int, fn func(i int64) error) {
	b.Helper()
	var seq atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range n {
		wg.Go(func() {
			for i := seq.Add(1); i <= int64(b.N); i = seq.Add(1) {
				if err := fn(i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// freshClaims claims key i of the bench scope, which must be acquired.
func freshClaims(ctx context.Context, s *idemredis.Store) func(i int64) error {
	return func(i int64) error {
		_, err := claimFresh(ctx, s, i)
		return err
	}
}

func claimFresh(ctx context.Context, s *idemredis.Store, i int64) (idem.Claim, error) {
	cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "bench", Key: "k" + strconv.FormatInt(i, 10), Lease: time.Minute})
	if err == nil && cl.Outcome != idem.Acquired {
		err = fmt.Errorf("outcome %v", cl.Outcome)
	}
	return cl, err
}

// runBatches claims b.N fresh keys from `callers` goroutines, each taking
// per keys at a time with one ClaimBatch, and reports claims/s.
func runBatches(b *testing.B, ctx context.Context, s *idemredis.Store, per int) {
	b.Helper()
	var seq atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range callers {
		wg.Go(func() {
			reqs := make([]idem.ClaimRequest, 0, per)
			for {
				hi := seq.Add(int64(per))
				lo := hi - int64(per) + 1
				if lo > int64(b.N) {
					return
				}
				reqs = reqs[:0]
				for i := lo; i <= min(hi, int64(b.N)); i++ {
					reqs = append(reqs, idem.ClaimRequest{Scope: "bench", Key: "k" + strconv.FormatInt(i, 10), Lease: time.Minute})
				}
				got, err := s.ClaimBatch(ctx, reqs)
				if err != nil {
					b.Error(err)
					return
				}
				for _, it := range got {
					if it.Err != nil || it.Outcome != idem.Acquired {
						b.Errorf("claim: %v, %v", it.Outcome, it.Err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// freshCycles claims key i and completes it with a small result.
func freshCycles(ctx context.Context, s *idemredis.Store) func(i int64) error {
	return func(i int64) error {
		cl, err := claimFresh(ctx, s, i)
		if err != nil {
			return err
		}
		return s.Complete(ctx, idem.CompleteRequest{Scope: "bench", Key: "k" + strconv.FormatInt(i, 10), Token: cl.Token,
			Result: []byte("ok"), Retention: time.Minute})
	}
}

// BenchmarkBatching compares the batched store with Coalesce 1 (one script
// call per claim or completion) for 1 to 64 concurrent callers, on claims
// alone and on whole lease cycles (Claim, then Complete).
//
// Run: go test -run '^$' -bench BenchmarkBatching -benchtime 20000x -count 5 ./store/idemredis
func BenchmarkBatching(b *testing.B) {
	ctx := context.Background()
	for _, work := range []struct {
		name string
		fn   func(context.Context, *idemredis.Store) func(int64) error
	}{{"Claim", freshClaims}, {"ClaimComplete", freshCycles}} {
		for _, n := range []int{1, 4, 8, 64} {
			for _, mode := range []struct {
				name     string
				maxBatch int
			}{{"Batched", 0}, {"Coalesce1", 1}} {
				b.Run(fmt.Sprintf("%s/callers=%d/%s", work.name, n, mode.name), func(b *testing.B) {
					c := newClient(b)
					s := newStore(b, c, &idemredis.Config{Coalesce: mode.maxBatch})
					runN(b, n, work.fn(ctx, s))
				})
			}
		}
	}
}

func benchPrefix() string {
	var r [6]byte
	_, _ = rand.Read(r[:])
	return "idembench:" + hex.EncodeToString(r[:]) + ":"
}

// BenchmarkClaim compares, in one run against the same server:
//
//   - Store: idem claims of fresh keys through the Store (batched), 64
//     concurrent callers;
//   - StoreBatch16: 64 callers claiming 16 fresh keys per ClaimBatch, the
//     in-flight depth of the -P 16 ceiling;
//   - StoreUnbatched: the same with Coalesce 1, one script call per
//     claim;
//   - GoRedisScript: the same claim script, one key per call, through
//     go-redis v9 with a pool of 64 connections, 64 concurrent callers (the
//     driver comparison, against StoreUnbatched);
//   - SetNXPX: a bare SET key v NX PX through rueidis, 64 callers (what the
//     script costs over Redis's cheapest dedupe command from Go);
//   - RedisBenchmarkP16 / RedisBenchmarkP1: redis-benchmark's SET NX PX with
//     64 clients, pipelined 16 deep (the ceiling) and unpipelined.
//
// Run: go test -run '^$' -bench BenchmarkClaim -benchtime 200000x ./store/idemredis
func BenchmarkClaim(b *testing.B) {
	url := redisURL(b)
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	b.Run("Store", func(b *testing.B) {
		c := newClient(b)
		s := newStore(b, c, nil)
		runCallers(b, freshClaims(ctx, s))
	})

	// The ceiling's own shape: 64 callers with 16 claims in flight each,
	// as a consumer that receives batches claims them.
	b.Run("StoreBatch16", func(b *testing.B) {
		c := newClient(b)
		s := newStore(b, c, nil)
		runBatches(b, ctx, s, 16)
	})

	// Every claim on its own call, as before batching and as on a cluster
	// client (rueidis auto-pipelines the concurrent calls).
	b.Run("StoreUnbatched", func(b *testing.B) {
		c := newClient(b)
		s := newStore(b, c, &idemredis.Config{Coalesce: 1})
		runCallers(b, freshClaims(ctx, s))
	})

	b.Run("GoRedisScript", func(b *testing.B) {
		gopt, err := redis.ParseURL(url)
		if err != nil {
			b.Fatal(err)
		}
		gopt.PoolSize = callers
		c := redis.NewClient(gopt)
		defer c.Close()
		script := redis.NewScript(idemredis.ClaimScript)
		prefix := benchPrefix()
		runCallers(b, func(i int64) error {
			k := strconv.FormatInt(i, 10)
			return script.Run(ctx, c, []string{prefix + "{" + k + "}"}, "60000", "60000", idemredis.Identity(idem.Fingerprint{}, "bench", k)).Err()
		})
	})

	b.Run("SetNXPX", func(b *testing.B) {
		c := newClient(b)
		prefix := benchPrefix()
		runCallers(b, func(i int64) error {
			return c.Do(ctx, c.B().Set().Key(prefix+strconv.FormatInt(i, 10)).Value("1").Nx().PxMilliseconds(60000).Build()).Error()
		})
	})

	for _, pipeline := range []int{16, 1} {
		b.Run(fmt.Sprintf("RedisBenchmarkP%d", pipeline), func(b *testing.B) {
			rps, err := redisBenchmark(opt.InitAddress[0], b.N, pipeline)
			if err != nil {
				b.Skip(err)
			}
			b.ReportMetric(rps, "ops/s")
		})
	}
}

// redisBenchmark runs redis-benchmark's SET key v NX PX with 64 clients
// over n requests and returns its requests per second.
func redisBenchmark(addr string, n, pipeline int) (float64, error) {
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return 0, fmt.Errorf("address %q has no port", addr)
	}
	if n < 10000 {
		n = 10000 // redis-benchmark's figure is meaningless on a few requests
	}
	bin := os.Getenv("REDIS_BENCHMARK")
	if bin == "" {
		bin = "redis-benchmark"
	}
	args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(callers), "-n", strconv.Itoa(n),
		"-P", strconv.Itoa(pipeline), "-r", "100000000", "--csv",
		"SET", benchPrefix() + "__rand_int__", "1", "NX", "PX", "60000"}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", bin, strings.Join(args, " "), err)
	}
	// --csv prints a header line and one line: "name","rps",...
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fields := strings.Split(lines[len(lines)-1], ",")
	if len(fields) < 2 {
		return 0, fmt.Errorf("redis-benchmark output %q", out)
	}
	return strconv.ParseFloat(strings.Trim(fields[1], `"`), 64)
}
