package idemredis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
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
func runCallers(b *testing.B, fn func(i int64) error) {
	b.Helper()
	var seq atomic.Int64
	b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := fn(seq.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

// freshClaims claims key i of the bench scope, which must be acquired.
func freshClaims(ctx context.Context, s *idemredis.Store) func(i int64) error {
	return func(i int64) error {
		cl, err := s.Claim(ctx, idem.ClaimRequest{Scope: "bench", Key: "k" + strconv.FormatInt(i, 10), Lease: time.Minute})
		if err == nil && cl.Outcome != idem.Acquired {
			err = fmt.Errorf("outcome %v", cl.Outcome)
		}
		return err
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
//   - StoreUnbatched: the same with MaxBatch 1, one script call per
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

	// Every claim on its own call, as before batching and as on a cluster
	// client (rueidis auto-pipelines the concurrent calls).
	b.Run("StoreUnbatched", func(b *testing.B) {
		c := newClient(b)
		s := newStore(b, c, &idemredis.Config{MaxBatch: 1})
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
