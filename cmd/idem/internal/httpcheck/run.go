package httpcheck

import (
	"context"
	"fmt"
	"net/url"
	"time"
)

// Result is a check's verdict.
type Result string

// The verdicts, from best to worst but for Skip: Warn is a behaviour that
// keeps the contract but weakens it (no replay marker, unbounded keys) or
// that the run could not prove either way; only Fail breaks it.
const (
	Pass Result = "PASS"
	Warn Result = "WARN"
	Skip Result = "SKIP"
	Fail Result = "FAIL"
)

// worse returns the worse of a and b (Fail over Warn over Pass).
func worse(a, b Result) Result {
	rank := map[Result]int{Pass: 0, Skip: 1, Warn: 2, Fail: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// CheckResult is one check's line of the report.
type CheckResult struct {
	Name     string  `json:"name"`
	Result   Result  `json:"result"`
	Evidence string  `json:"evidence"`
	Seconds  float64 `json:"seconds"`
}

// Report is a whole run.
type Report struct {
	// Target is the URL checked, its password hidden.
	Target    string        `json:"target"`
	Method    string        `json:"method"`
	KeyHeader string        `json:"key_header"`
	Checks    []CheckResult `json:"checks"`
	// Requests is how many requests the run sent, count reads included.
	Requests int64 `json:"requests"`
	// Passed: no check failed and the run was not interrupted.
	Passed      bool `json:"passed"`
	Interrupted bool `json:"interrupted,omitempty"`
}

// Failed returns the names of the checks that failed.
func (rep Report) Failed() []string {
	var names []string
	for _, c := range rep.Checks {
		if c.Result == Fail {
			names = append(names, c.Name)
		}
	}
	return names
}

// check is one named check of a run.
type check struct {
	name string
	run  func(r *runner, ctx context.Context) (Result, string)
}

// Checks, in the order they run: replay first, as it tells whether the
// endpoint answers at all; expiry last, as it waits out the TTL.
var checks = []check{
	{"replay", (*runner).checkReplay},
	{"storm", (*runner).checkStorm},
	{"in flight", (*runner).checkInFlight},
	{"mismatch", (*runner).checkMismatch},
	{"missing key", (*runner).checkMissingKey},
	{"key limits", (*runner).checkKeyLimits},
	{"disconnect", (*runner).checkDisconnect},
	{"scope isolation", (*runner).checkScope},
	{"expiry", (*runner).checkExpiry},
}

// CheckNames returns the names of the checks in the order they run.
func CheckNames() []string {
	names := make([]string, len(checks))
	for i, c := range checks {
		names[i] = c.name
	}
	return names
}

// Run checks the endpoint cfg names and calls each, when not nil, with each
// check's result as it ends. It returns an error, and sends nothing, when
// cfg is invalid (ErrConfig), the target is not loopback and not owned
// (ErrRemote), the target does not accept connections or the count URL
// does not answer. A failed check is no error: see Report.Passed. When ctx
// ends, the report so far is returned with Interrupted set.
func Run(ctx context.Context, cfg Config, each func(CheckResult)) (Report, error) {
	target, err := cfg.normalize()
	if err != nil {
		return Report{}, err
	}
	rep := Report{Target: safeURL(target), Method: cfg.Method, KeyHeader: cfg.KeyHeader, Checks: []CheckResult{}}
	if !cfg.AllowRemote {
		if err := checkLoopback(ctx, "--url", target); err != nil {
			return rep, err
		}
		if cfg.CountURL != "" {
			cu, _ := url.Parse(cfg.CountURL)
			if err := checkLoopback(ctx, "--count-url", cu); err != nil {
				return rep, err
			}
		}
	}
	r := newRunner(cfg, target)
	if err := r.reach(ctx); err != nil {
		return rep, err
	}
	if _, _, err := r.count(ctx); err != nil {
		return rep, err
	}
	for _, c := range checks {
		start := time.Now()
		res, ev := Skip, ""
		if r.gate != "" {
			ev = r.gate
		} else {
			res, ev = c.run(r, ctx)
		}
		if ctx.Err() != nil {
			rep.Interrupted = true
			break
		}
		cr := CheckResult{Name: c.name, Result: res, Evidence: r.redact(ev), Seconds: time.Since(start).Seconds()}
		rep.Checks = append(rep.Checks, cr)
		if each != nil {
			each(cr)
		}
	}
	rep.Requests = r.sent.Load()
	rep.Passed = len(rep.Failed()) == 0 && !rep.Interrupted
	return rep, nil
}

// reach opens and closes one connection to the target: a run against a
// closed port says so once instead of failing every check.
func (r *runner) reach(ctx context.Context) error {
	conn, err := r.dialer.DialContext(ctx, "tcp", r.addr())
	if err != nil {
		return fmt.Errorf("cannot reach %s: %w", safeURL(r.target), err)
	}
	return conn.Close()
}
