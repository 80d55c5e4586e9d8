package bench

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkHTTPSideBySide runs the rows of the HTTP and proxy groups
// interleaved in small rounds (64 requests from HTTPClients clients per row
// per round), so that on a shared machine a burst of load from elsewhere
// slows every row alike: the ratios it reports are the issue 21 targets'
// (replay vs bare handler, durable first execution vs the durable bare
// handler, the proxy's replay and first execution vs a bare
// httputil.ReverseProxy), each a share of total time over many rounds.
//
//	go test -run '^$' -bench HTTPSideBySide -benchtime 100x ./bench
func BenchmarkHTTPSideBySide(b *testing.B) {
	const perRound = 64
	ctx := context.Background()
	env, err := NewEnv("", "")
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	var rows []*Scenario
	for _, s := range Scenarios(QuickSizes) {
		if s.Group == GroupHTTP || s.Group == GroupProxy {
			rows = append(rows, s)
		}
	}
	runs := make([]Run, len(rows))
	for i, s := range rows {
		if runs[i], err = prepare(ctx, env, s); err != nil {
			b.Fatalf("%s: %v", s.Name, err)
		}
	}
	took := make([]time.Duration, len(rows))
	sent := make([]int, len(rows))
	for b.Loop() {
		for i, s := range rows {
			env.streams++
			st := NewStream(fmt.Sprintf("%s-sbs-%d", env.Prefix, env.streams), perRound, 0, uint64(env.streams))
			if runs[i].Before != nil {
				if err := runs[i].Before(ctx, st); err != nil {
					b.Fatalf("%s: before: %v", s.Name, err)
				}
			}
			start := time.Now()
			if err := runs[i].Exec(ctx, st); err != nil {
				b.Fatalf("%s: %v", s.Name, err)
			}
			took[i] += time.Since(start)
			sent[i] += len(st.Keys)
			if runs[i].After != nil {
				if err := runs[i].After(ctx, st); err != nil {
					b.Fatalf("%s: check: %v", s.Name, err)
				}
			}
		}
	}
	rate := map[string]float64{}
	for i, s := range rows {
		rate[s.Group+"/"+s.Name] = float64(sent[i]) / took[i].Seconds()
		b.Logf("%-60s %8.0f req/s", s.Name, rate[s.Group+"/"+s.Name])
	}
	for _, t := range targets {
		if t.group != GroupHTTP && t.group != GroupProxy {
			continue
		}
		num, den := rate[t.group+"/"+t.num.name], rate[t.group+"/"+t.den.name]
		if den > 0 {
			b.Logf("%-80s %5.0f%% (target %.0f%%)", t.what, 100*num/den, 100*t.goal)
		}
	}
	b.ReportMetric(100*rate[GroupHTTP+"/"+HTTPReplay]/rate[GroupHTTP+"/"+HTTPBare], "replay-%bare")
	b.ReportMetric(100*rate[GroupHTTP+"/"+HTTPDurableFirst]/rate[GroupHTTP+"/"+HTTPDurableBare], "first-%durable")
	b.ReportMetric(100*rate[GroupProxy+"/"+ProxyIdemReplay]/rate[GroupProxy+"/"+ProxyBare], "proxy-replay-%bare")
	b.ReportMetric(100*rate[GroupProxy+"/"+ProxyIdemFirst]/rate[GroupProxy+"/"+ProxyBare], "proxy-first-%bare")
}
