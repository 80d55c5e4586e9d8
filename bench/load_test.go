package bench

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseCPU(t *testing.T) {
	t.Parallel()
	c, ok := parseCPU("cpu  100 5 50 800 10 1 2 32 0 0\ncpu0 50 2 25 400 5 0 1 16 0 0\n")
	if !ok || c.user != 100 || c.idle != 800 || c.steal != 32 || !c.hasSteal || c.total() != 1000 {
		t.Fatalf("%+v %v", c, ok)
	}
	old, ok := parseCPU("cpu 1 2 3 4\n") // before iowait was counted
	if !ok || old.hasSteal || old.total() != 10 {
		t.Fatalf("%+v %v", old, ok)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 x 3 4 5"} {
		if _, ok := parseCPU(bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestLoadProbe(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := &loadProbe{procStat: dir + "/stat", procLoad: dir + "/loadavg"}
	p.begin() // nothing to read: unknown, not zero
	l := p.end()
	if l.Load1Start != -1 || l.Busy != -1 || l.Steal != -1 || !strings.HasPrefix(l.String(), "over ") {
		t.Fatalf("%+v %q", l, l)
	}
	if got := (GroupLoad{Load1Start: -1, Load1End: -1, Busy: -1, Steal: -1}).String(); got != "not available on this system" {
		t.Errorf("empty load: %q", got)
	}
	got := GroupLoad{Load1Start: 1.5, Load1End: 3.25, Busy: 0.8, Steal: 0.012}.String()
	if got != "load average 1.50 → 3.25, CPU busy 80%, steal 1.2%" {
		t.Errorf("load line %q", got)
	}
	// This machine's own files, where there are some.
	if real := startLoad().end(); real.Load1Start < -1 || real.Busy > 1 || real.Steal > 1 {
		t.Errorf("implausible load %+v", real)
	}
}

func TestRerunNoisy(t *testing.T) {
	t.Parallel()
	results := []Result{
		{Rates: []float64{100, 110, 105}},              // steady
		{Rates: []float64{100, 300, 200}},              // noisy, steady on rerun
		{Rates: []float64{10, 50, 30}},                 // noisy, still noisy
		{Rates: []float64{1, 9}, Err: errors.New("x")}, // failed: left alone
		{Rates: []float64{100, 500}},                   // noisy, rerun fails
	}
	var asked []int
	rerunNoisy(func(rows []int) {
		asked = rows
		for _, i := range rows {
			switch i {
			case 1:
				results[i].Rates = []float64{190, 200, 210}
			case 2:
				results[i].Rates = []float64{10, 40, 25}
			case 4:
				results[i].Err = errors.New("server gone")
			}
		}
	}, results)
	if fmt.Sprint(asked) != "[1 2 4]" {
		t.Fatalf("reran rows %v, want [1 2 4]", asked)
	}
	if results[0].Rerun || !results[1].Rerun || results[1].Noisy() || !results[2].Noisy() || results[3].Rerun {
		t.Errorf("after the rerun: %+v", results)
	}
	if fmt.Sprint(results[1].FirstRates) != "[100 300 200]" {
		t.Errorf("first runs %v", results[1].FirstRates)
	}
	if r := results[4]; r.Err != nil || r.RerunErr == nil || fmt.Sprint(r.Rates) != "[100 500]" {
		t.Errorf("failed rerun: %+v", r)
	}
	rep := &Report{Runs: 3, Results: results}
	for i := range rep.Results {
		rep.Results[i].Scenario = &Scenario{Group: GroupHTTP, Name: fmt.Sprint("row", i), Role: RoleIdem, Concurrency: 1}
	}
	var b strings.Builder
	if err := rep.WriteMarkdown(&b, nil); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{"| row1 | idem | 1 | 0 | **200** (190–210) rerun, first runs 100–300 |",
		"(10–40) noisy rerun, first runs 10–50", "rerun failed: server gone"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// Every target's rows exist under those names in the report, so that a
// renamed row cannot silently turn a target into "not measured".
func TestTargetsNameRealRows(t *testing.T) {
	t.Parallel()
	type key struct {
		group string
		role  Role
		name  string
	}
	rows := map[key]bool{}
	for _, s := range Scenarios(QuickSizes) {
		rows[key{s.Group, s.Role, s.Name}] = true
		rows[key{s.Group, s.Role, ""}] = true
	}
	for _, tg := range targets {
		if !rows[key{tg.group, tg.num.role, tg.num.name}] {
			t.Errorf("%s: no %s row %q in %q", tg.what, tg.num.role, tg.num.name, tg.group)
		}
		if tg.den != (rowRef{}) && !rows[key{tg.group, tg.den.role, tg.den.name}] {
			t.Errorf("%s: no %s row %q in %q", tg.what, tg.den.role, tg.den.name, tg.group)
		}
	}
}

func TestHeadlines(t *testing.T) {
	t.Parallel()
	res := func(group, name string, role Role, c, d int, rates ...float64) Result {
		return Result{Scenario: &Scenario{Group: group, Name: name, Role: role, Concurrency: c, DupPercent: d}, Rates: rates}
	}
	rep := &Report{Results: []Result{
		res(GroupHTTP, HTTPBare, RoleCeiling, HTTPClients, 0, 1000),
		res(GroupHTTP, HTTPReplay, RoleIdem, HTTPClients, 0, 850),
		res(GroupPostgres1000, PG1000Ceiling, RoleCeiling, 1, 0, 100000),
		res(GroupPostgres1000, PG1000Batch, RoleIdem, 1, 0, 95000),
		res(GroupPostgres1000, PG1000Ceiling, RoleCeiling, 8, 30, 200000),
		res(GroupPostgres1000, PG1000Batch, RoleIdem, 8, 30, 150000),
	}}
	got := map[string]Headline{}
	for _, h := range rep.Headlines() {
		got[h.What] = h
	}
	if h := got["idem middleware replay vs bare handler"]; !h.Met() || h.Value != 0.85 {
		t.Errorf("replay: %+v", h)
	}
	if h := got["idem ProcessBatch ×1000 vs raw 1,000-key INSERT ceiling"]; h.Met() || h.Value != 0.75 || !strings.Contains(h.Where, "worst cell") || !strings.Contains(h.Where, "c=8, 30%") {
		t.Errorf("×1000 vs ceiling, worst cell: %+v", h)
	}
	if h := got["idem ProcessBatch ×1000 with the ledger effect (msgs/s)"]; h.Met() || h.Value != 95000 || !h.Rate {
		t.Errorf("×1000 rate: %+v", h)
	}
	if h := got["idem proxy replay vs bare httputil.ReverseProxy"]; h.Met() || h.Where != "not measured" {
		t.Errorf("unmeasured target: %+v", h)
	}
	var b strings.Builder
	if err := rep.WriteMarkdown(&b, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| idem ProcessBatch ×1000 with the ledger effect (msgs/s) | 95.0k msgs/s | ≥ 100k msgs/s | **not met** |") {
		t.Errorf("headline table:\n%s", b.String())
	}
}
