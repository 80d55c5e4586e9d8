package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPUs     int
	MemoryGB float64
	Go       string
	OS       string
	Postgres string
	// PostgresStorage is where the server keeps the benchmarks' tables and
	// how that filesystem is mounted (see PostgresStorage); "" if unknown.
	PostgresStorage string
	MySQL           string
	Redis           string
	// Load is a free-text note on what else ran (shared machine).
	Load string
}

// Report is everything BENCHMARKS.md is made of.
type Report struct {
	Date    time.Time
	Command string
	Runs    int
	Quick   bool
	Machine Machine
	Results []Result
	// ColdStart is the README main job's cold build (nil: not measured).
	ColdStart *ColdStart
}

// find returns the result of group with role at (c, d), or nil.
func (r *Report) find(group string, role Role, name string, c, d int) *Result {
	for i := range r.Results {
		s := r.Results[i].Scenario
		if s.Group == group && s.Role == role && (name == "" || s.Name == name) && s.Concurrency == c && s.DupPercent == d {
			return &r.Results[i]
		}
	}
	return nil
}

// ratio is a's median over b's, or 0 when either is missing.
func ratio(a, b *Result) float64 {
	if a == nil || b == nil || a.Err != nil || b.Err != nil || b.Median() == 0 {
		return 0
	}
	return a.Median() / b.Median()
}

func fmtRate(v float64) string {
	switch {
	case v >= 100000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 10000:
		return fmt.Sprintf("%.1fk", v/1000)
	}
	return fmt.Sprintf("%.0f", v)
}

func fmtRatio(v float64) string {
	switch {
	case v == 0:
		return "—"
	case v >= 10:
		return fmt.Sprintf("%.0f×", v)
	case v >= 1:
		return fmt.Sprintf("%.1f×", v)
	}
	return fmt.Sprintf("%.0f%%", v*100)
}

// Headline is one of the ratios the project sets a target for.
type Headline struct {
	What   string
	Value  float64
	Target float64
	Where  string // which cell
	// Rate: Value and Target are messages per second, not a ratio.
	Rate bool
}

// Met reports whether the target was reached.
func (h Headline) Met() bool { return h.Value > 0 && h.Value >= h.Target }

// rowRef names a row of a group: by role, and by name unless empty.
type rowRef struct {
	role Role
	name string
}

// target is one headline: num's median over den's (or num's own rate
// when den is zero) in the cell (c, d), or in every cell num has when c
// is zero, where the worst cell is the one shown.
type target struct {
	what     string
	group    string
	num, den rowRef
	goal     float64
	c, d     int
}

// targets are issue 21's targets, in the report's order.
var targets = []target{
	{"idem middleware replay vs bare handler", GroupHTTP, rowRef{RoleIdem, HTTPReplay}, rowRef{RoleCeiling, HTTPBare}, 0.8, HTTPClients, 0},
	{"idem middleware + durable handler, first execution vs durable bare handler", GroupHTTP,
		rowRef{RoleIdem, HTTPDurableFirst}, rowRef{RoleCeiling, HTTPDurableBare}, 0.5, HTTPClients, 0},
	{"idem proxy replay vs bare httputil.ReverseProxy", GroupProxy, rowRef{RoleIdem, ProxyIdemReplay}, rowRef{RoleCeiling, ProxyBare}, 1, HTTPClients, 0},
	{"idem proxy first execution vs bare httputil.ReverseProxy", GroupProxy, rowRef{RoleIdem, ProxyIdemFirst}, rowRef{RoleCeiling, ProxyBare}, 0.5, HTTPClients, 0},
	{"idem ProcessBatch ×1000 with the ledger effect (msgs/s)", GroupPostgres1000, rowRef{RoleIdem, PG1000Batch}, rowRef{}, 100000, 0, 0},
	{"idem ProcessBatch ×1000 vs raw 1,000-key INSERT ceiling", GroupPostgres1000, rowRef{RoleIdem, PG1000Batch}, rowRef{RoleCeiling, PG1000Ceiling}, 0.9, 0, 0},
	{"idem ProcessBatch ×100 vs raw ceiling", GroupPostgres, rowRef{RoleIdem, "idem ProcessBatch ×100"}, rowRef{RoleCeiling, ""}, 0.9, 0, 0},
	{"idem ProcessBatch ×100 vs River unique InsertManyTx", GroupPostgres, rowRef{RoleIdem, "idem ProcessBatch ×100"}, rowRef{RolePeer, ""}, 3, 0, 0},
	{"idem ProcessBatch ×100 vs textbook", GroupPostgres, rowRef{RoleIdem, "idem ProcessBatch ×100"}, rowRef{RoleTextbook, ""}, 20, 8, 30},
	{"idem Process vs textbook (PostgreSQL)", GroupPostgres, rowRef{RoleIdem, "idem Process"}, rowRef{RoleTextbook, ""}, 1, 0, 0},
	{"idem Process vs textbook (SQLite)", GroupSQLite, rowRef{RoleIdem, "idem Process"}, rowRef{RoleTextbook, ""}, 1, 0, 0},
	{"idem Redis Claim + Complete vs " + RedisBenchmarkCeiling, GroupRedis, rowRef{RoleIdem, "idem Store.Claim + Complete"},
		rowRef{RoleCeiling, RedisBenchmarkCeiling}, 0.4, RedisCallers, 0},
	{"idem Redis Claim vs " + RedisBenchmarkCeiling, GroupRedis, rowRef{RoleIdem, "idem Store.Claim (rueidis)"},
		rowRef{RoleCeiling, RedisBenchmarkCeiling}, 0.5, RedisCallers, 0},
	{"claims during partition retention vs without retention", GroupRetention, rowRef{RoleIdem, RetentionPartDrop},
		rowRef{RoleCeiling, RetentionPartNone}, 0.9, 0, 0},
}

// Headlines computes issue 21's targets. A target whose rows were not
// measured (filtered out, failed) has value 0 and is not met.
func (r *Report) Headlines() []Headline {
	hs := make([]Headline, 0, len(targets))
	for _, t := range targets {
		hs = append(hs, r.headline(t))
	}
	return hs
}

func (r *Report) headline(t target) Headline {
	h := Headline{What: t.what, Target: t.goal, Rate: t.den == rowRef{}, Where: "not measured"}
	first := true
	for i := range r.Results {
		res := &r.Results[i]
		s := res.Scenario
		if s.Group != t.group || s.Role != t.num.role || s.Name != t.num.name || (t.c != 0 && (s.Concurrency != t.c || s.DupPercent != t.d)) {
			continue
		}
		v := res.Median()
		if res.Err != nil {
			v = 0
		}
		if !h.Rate {
			v = ratio(res, r.find(t.group, t.den.role, t.den.name, s.Concurrency, s.DupPercent))
		}
		if first || v < h.Value {
			h.Value, first = v, false
			h.Where = fmt.Sprintf("%s, c=%d, %d%% duplicates", t.group, s.Concurrency, s.DupPercent)
			if t.c == 0 {
				h.Where = "worst cell: " + h.Where
			}
		}
	}
	return h
}

// WriteMarkdown writes BENCHMARKS.md. charts, if not empty, is the path of
// the chart directory relative to the report.
func (r *Report) WriteMarkdown(w io.Writer, charts map[string]string) error {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("Generated by `bench/cmd/idembench`; do not edit by hand.\n\n")
	fmt.Fprintf(&b, "- **Date:** %s\n", r.Date.UTC().Format("2006-01-02 15:04 MST"))
	m := r.Machine
	fmt.Fprintf(&b, "- **Machine:** %d CPUs, %.1f GB memory, %s, %s\n", m.CPUs, m.MemoryGB, m.OS, m.Go)
	fmt.Fprintf(&b, "- **Servers:** PostgreSQL %s, MySQL %s, Redis %s (loopback); SQLite embedded (modernc.org/sqlite, WAL, synchronous=FULL)\n", orNA(m.Postgres), orNA(m.MySQL), orNA(m.Redis))
	if m.PostgresStorage != "" {
		fmt.Fprintf(&b, "- **PostgreSQL's tables:** %s\n", m.PostgresStorage)
	}
	fmt.Fprintf(&b, "- **Command:** `%s`\n", r.Command)
	mode := fmt.Sprintf("median of %d runs per row, with min–max", r.Runs)
	if r.Quick {
		mode = "QUICK mode: every scenario once at a tiny size; the numbers mean nothing"
	}
	fmt.Fprintf(&b, "- **Method:** %s; every run checks its effect was applied exactly once per distinct message\n", mode)
	if m.Load != "" {
		fmt.Fprintf(&b, "- **Load:** %s\n", m.Load)
	}
	b.WriteString("\nAbsolute numbers drift on shared machines (other jobs, CPU steal, disk cache). " +
		"The ratios — each row against the ceiling and the textbook pattern of its own group, " +
		"measured minutes apart against the same servers — are what to read.\n\n")

	b.WriteString("## Headline ratios\n\nIssue 21's targets, each from one run of both rows side by side; " +
		"\"worst cell\" targets hold in every cell of the group, so the worst is shown.\n\n" +
		"| Target | Value | Goal | | Cell |\n|---|---:|---:|---|---|\n")
	for _, h := range r.Headlines() {
		mark := "met"
		if !h.Met() {
			mark = "**not met**"
		}
		val, goal := fmtRatio(h.Value), fmtRatio(h.Target)
		if h.Rate {
			val, goal = fmtRate(h.Value)+" msgs/s", fmtRate(h.Target)+" msgs/s"
		}
		fmt.Fprintf(&b, "| %s | %s | ≥ %s | %s | %s |\n", h.What, val, goal, mark, h.Where)
	}
	b.WriteString("\n")
	if r.ColdStart != nil {
		r.ColdStart.markdown(&b)
	}

	for _, g := range Groups {
		var rows []Result
		for _, res := range r.Results {
			if res.Scenario.Group == g {
				rows = append(rows, res)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n", g)
		if p, ok := charts[g]; ok {
			fmt.Fprintf(&b, "![%s](%s)\n\n", g, p)
		}
		if l := rows[0].Load; l != nil {
			fmt.Fprintf(&b, "Machine load during this group: %s.\n\n", l)
		}
		b.WriteString("| Scenario | Role | Concurrency | Dup % | msgs/s median (min–max) | vs ceiling | vs textbook | Note |\n")
		b.WriteString("|---|---|---:|---:|---|---:|---:|---|\n")
		for i := range rows {
			res := &rows[i]
			s := res.Scenario
			cell := fmt.Sprintf("**%s** (%s–%s)", fmtRate(res.Median()), fmtRate(res.Min()), fmtRate(res.Max()))
			if res.Noisy() {
				cell += " noisy"
			}
			if res.Rerun {
				cell += fmt.Sprintf(" rerun, first runs %s–%s", fmtRate(slices.Min(res.FirstRates)), fmtRate(slices.Max(res.FirstRates)))
				if res.RerunErr != nil {
					cell += " (rerun failed: " + strings.ReplaceAll(res.RerunErr.Error(), "|", "/") + ")"
				}
			}
			if res.Err != nil {
				cell = "failed: " + strings.ReplaceAll(res.Err.Error(), "|", "/")
			}
			ceil := r.find(g, RoleCeiling, "", s.Concurrency, s.DupPercent)
			text := r.find(g, RoleTextbook, "", s.Concurrency, s.DupPercent)
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s | %s | %s |\n", s.Name, s.Role, s.Concurrency, s.DupPercent, cell,
				fmtRatio(ratio(res, ceil)), fmtRatio(ratio(res, text)), s.Note)
		}
		b.WriteString("\n")
	}
	b.WriteString(closingNote)
	_, err := io.WriteString(w, b.String())
	return err
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

// closingNote explains the rows whose meaning is not in the numbers.
const closingNote = `## How to read the rows

- **Ceiling** rows do less than idem on purpose: the PostgreSQL and SQLite ceilings insert the
  same keys with a multi-row ` + "`INSERT … ON CONFLICT DO NOTHING`" + ` and no effect or transaction
  around it, the MariaDB ceiling with a multi-row ` + "`INSERT … ON DUPLICATE KEY UPDATE`" + ` that changes
  nothing; the Redis ceiling is a bare pipelined ` + "`SET NX PX`" + ` (no record, no fencing token, no
  fingerprint); the HTTP ceiling is the handler without the middleware. They bound what any
  dedupe can reach on this machine.
- **Textbook** rows are the hand-written pattern: one transaction per message with
  ` + "`INSERT … ON CONFLICT DO NOTHING`" + `, the balance ` + "`UPDATE`" + ` and ` + "`COMMIT`" + `.
- **River** inserts unique jobs (` + "`UniqueOpts{ByArgs: true}`" + `) with ` + "`InsertManyTx`" + ` in the same
  transaction as the ledger update, crediting only the jobs not skipped as duplicates: the same
  guarantee as idem's batch. River refuses a key twice in one statement, so its batches drop
  in-batch repeats first (they count as duplicates); concurrent batches that deadlock are retried.
- **Watermill's Deduplicator** keeps its keys in a map in memory: it is not durable (a restart
  forgets every key) and it marks a message before running the handler, so a failed message's
  redelivery is dropped. It is here as the in-memory speed reference, not as an equivalent.
- **noisy**: a row whose fastest run is more than twice its slowest is rerun once, automatically,
  right after its group (its cell then says "rerun" and the first runs' range); one still that
  spread after the rerun is marked "noisy". Each group's line "Machine load" gives the load
  average at its start and end, and the CPU time busy and stolen by the hypervisor over it.
- The HTTP and proxy groups' durable rows commit one row per request to their own SQLite file
  (WAL, synchronous=FULL); idem's rows wrap that same handler, and check after each run that
  it recorded exactly one payment per key. The replay rows with the replay cache serve
  completed responses from memory for at most its max age (the bound on a deleted key).
- Every ledger row checks, after each run, that the balances hold exactly one credit per
  distinct message.
`
