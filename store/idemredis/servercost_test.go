package idemredis_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

// serverStats is what a private redis-server reports about the commands it
// ran: per command, calls and µs inside the command (INFO commandstats), and
// the server's CPU time, which also counts reading requests and writing
// replies.
type serverStats struct {
	calls map[string]int64
	usec  map[string]int64
	cpuUS int64
}

func readServerStats(tb testing.TB, c rueidis.Client) serverStats {
	tb.Helper()
	ctx := context.Background()
	st := serverStats{calls: map[string]int64{}, usec: map[string]int64{}}
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for f := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls[name] = n
			case "usec":
				st.usec[name] = n
			}
		}
	}
	cpu, err := c.Do(ctx, c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.SplitSeq(cpu, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			st.cpuUS += int64(f * 1e6)
		}
	}
	return st
}

// reportServerCost reports, for the b.N operations between before and
// after: the server's µs inside cmd per operation and per call of cmd, and
// its CPU µs per operation.
func reportServerCost(b *testing.B, before, after serverStats, cmd string) {
	calls := after.calls[cmd] - before.calls[cmd]
	usec := after.usec[cmd] - before.usec[cmd]
	if calls > 0 {
		b.ReportMetric(float64(usec)/float64(calls), "srv-µs/call")
		b.ReportMetric(float64(b.N)/float64(calls), "keys/call")
	}
	b.ReportMetric(float64(usec)/float64(b.N), "srv-µs/op")
	b.ReportMetric(float64(after.cpuUS-before.cpuUS)/float64(b.N), "cpu-µs/op")
}

// BenchmarkServerCost measures what each operation costs a private,
// otherwise idle redis-server (so that other users of the shared server do
// not count): the time INFO commandstats reports inside the command
// (srv-µs), per script call and per operation, and the server's CPU time
// per operation (cpu-µs/op, which also counts parsing requests and writing
// replies). 64 callers, fresh keys, as in the bench group "Redis: claims".
// SetNXPX is the reference: the ceiling's command.
//
// Run: go test -run '^$' -bench BenchmarkServerCost -benchtime 100000x ./store/idemredis
func BenchmarkServerCost(b *testing.B) {
	addr := startRedis(b)
	c := clientAt(b, addr)
	ctx := context.Background()
	var prefixes atomic.Int64
	store := func(b *testing.B, coalesce int) *idemredis.Store {
		s, err := idemredis.New(c, &idemredis.Config{Prefix: fmt.Sprintf("cost%d:", prefixes.Add(1)), Coalesce: coalesce,
			Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	// timed runs fn for b.N operations from 64 callers between two
	// readings of the server's stats, and reports cmd's cost.
	timed := func(b *testing.B, cmd string, fn func(i int64) error) {
		if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
			b.Fatal(err)
		}
		before := readServerStats(b, c)
		runCallers(b, fn)
		after := readServerStats(b, c)
		reportServerCost(b, before, after, cmd)
	}
	claimsOf := func(b *testing.B, s *idemredis.Store) []idem.Claim {
		claims := make([]idem.Claim, b.N+1)
		var mu sync.Mutex
		runCallers(b, func(i int64) error {
			cl, err := claimFresh(ctx, s, i)
			mu.Lock()
			claims[i] = cl
			mu.Unlock()
			return err
		})
		return claims
	}
	complete := func(s *idemredis.Store, claims []idem.Claim) func(i int64) error {
		return func(i int64) error {
			return s.Complete(ctx, idem.CompleteRequest{Scope: "bench", Key: "k" + strconv.FormatInt(i, 10), Token: claims[i].Token,
				Result: []byte("ok"), Retention: time.Minute})
		}
	}

	b.Run("SetNXPX", func(b *testing.B) {
		timed(b, "set", func(i int64) error {
			return c.Do(ctx, c.B().Set().Key("cost:"+strconv.FormatInt(i, 10)).Value("1").Nx().PxMilliseconds(60000).Build()).Error()
		})
	})
	for _, mode := range []struct {
		name     string
		coalesce int
	}{{"Coalesce1", 1}, {"Batched", 0}} {
		b.Run("Claim/"+mode.name, func(b *testing.B) {
			timed(b, "evalsha", freshClaims(ctx, store(b, mode.coalesce)))
		})
		b.Run("Complete/"+mode.name, func(b *testing.B) {
			s := store(b, mode.coalesce)
			b.StopTimer()
			if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
				b.Fatal(err)
			}
			claims := claimsOf(b, s)
			b.StartTimer()
			before := readServerStats(b, c)
			runCallers(b, complete(s, claims))
			after := readServerStats(b, c)
			reportServerCost(b, before, after, "evalsha")
		})
	}
}
