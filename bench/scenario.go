package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"time"
)

// Role says what a scenario is within its group, and so which rows the
// ratios are taken against.
type Role int

const (
	// RoleIdem is idem itself.
	RoleIdem Role = iota + 1
	// RoleCeiling is the backend's raw speed for the same keys without the
	// guarantees: the upper bound. Ratios are taken against it.
	RoleCeiling
	// RoleTextbook is what a careful engineer would hand-write. Ratios are
	// taken against it.
	RoleTextbook
	// RolePeer is another library that solves the same problem.
	RolePeer
)

func (r Role) String() string {
	switch r {
	case RoleIdem:
		return "idem"
	case RoleCeiling:
		return "ceiling"
	case RoleTextbook:
		return "textbook"
	case RolePeer:
		return "peer"
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// Group names, in report order.
const (
	GroupPostgres = "PostgreSQL: dedupe + ledger effect"
	GroupMySQL    = "MariaDB: dedupe + ledger effect"
	GroupRedis    = "Redis: claims"
	GroupSQLite   = "Embedded SQLite: dedupe"
	GroupHTTP     = "HTTP: Idempotency-Key middleware (SQLite store)"
	GroupProxy    = "HTTP proxy: idem proxy vs httputil.ReverseProxy (SQLite store)"
	GroupConsumer = "Consumer path in process (Watermill peer)"
)

// Groups lists the groups in report order.
var Groups = []string{GroupPostgres, GroupPostgres1000, GroupRetention, GroupMySQL, GroupRedis, GroupSQLite, GroupHTTP, GroupProxy, GroupConsumer}

// Needs names the services a scenario needs.
type Needs int

const (
	// NeedsPostgres: the scenario needs Env.PostgresURL.
	NeedsPostgres Needs = 1 << iota
	// NeedsRedis: the scenario needs Env.RedisURL.
	NeedsRedis
	// NeedsMySQL: the scenario needs Env.MySQLURL.
	NeedsMySQL
)

// Scenario is one row of the report.
type Scenario struct {
	Group       string
	Name        string
	Role        Role
	Concurrency int
	DupPercent  int
	// Messages is how many deliveries one run makes.
	Messages int
	// Note is printed in the row (for example "not durable").
	Note  string
	Needs Needs
	// Prepare sets the scenario up and returns what one run does. It may
	// register cleanups on env.
	Prepare func(ctx context.Context, env *Env, s *Scenario) (Run, error)
}

// Run executes one timed run over stream. Work that must not be timed
// (for example making the keys of a replay exist) goes in Before; checks
// that the run was exactly-once go in After.
type Run struct {
	Before func(ctx context.Context, stream Stream) error
	Exec   func(ctx context.Context, stream Stream) error
	After  func(ctx context.Context, stream Stream) error
	// Rate, if set, replaces Exec for a scenario that times itself, such
	// as an external benchmark tool: it runs the stream and returns
	// messages per second.
	Rate func(ctx context.Context, stream Stream) (float64, error)
}

// ID is a stable identifier of the row.
func (s *Scenario) ID() string {
	return fmt.Sprintf("%s/%s/c%d/d%d", s.Group, s.Name, s.Concurrency, s.DupPercent)
}

// Env is what scenarios share: the servers, a scratch directory and the
// cleanups to run at the end.
type Env struct {
	PostgresURL string
	RedisURL    string
	// MySQLURL is a mysql:// URL or a go-sql-driver DSN (set it after
	// NewEnv); the MySQL group needs it.
	MySQLURL string
	// Dir is a scratch directory for SQLite files.
	Dir string
	// Prefix is unique per invocation, so that runs never see each other's
	// keys, schemas or files.
	Prefix   string
	cleanups []func()
	shared   map[string]any
	// streams numbers the streams, so that no two runs share a key even
	// across calls to Measure.
	streams int
}

// Cleanup registers fn to run at Close, last registered first.
func (e *Env) Cleanup(fn func()) { e.cleanups = append(e.cleanups, fn) }

// Close runs the cleanups.
func (e *Env) Close() {
	for _, fn := range slices.Backward(e.cleanups) {
		fn()
	}
	e.cleanups = nil
}

// sharedValue returns the value stored under name, creating it with make
// the first time; scenarios of one group share a connection pool this way.
func sharedValue[T any](e *Env, name string, make func() (T, error)) (T, error) {
	if e.shared == nil {
		e.shared = map[string]any{}
	}
	if v, ok := e.shared[name]; ok {
		return v.(T), nil
	}
	v, err := make()
	if err != nil {
		return v, err
	}
	e.shared[name] = v
	return v, nil
}

// Result is a scenario's measurements.
type Result struct {
	Scenario *Scenario
	// Rates are messages per second, one per run.
	Rates []float64
	// Err is set when the scenario could not run; the report says so.
	Err error
	// Rerun is set when the row's first runs were noisy (see
	// [Result.Noisy]) and were made again; FirstRates are the first runs,
	// RerunErr why the rerun failed (then Rates are the first runs).
	Rerun      bool
	FirstRates []float64
	RerunErr   error
	// Load is the machine's load while the row's group ran.
	Load *GroupLoad
}

// Median, Min and Max summarise Rates (0 when there are none).
func (r Result) Median() float64 {
	if len(r.Rates) == 0 {
		return 0
	}
	s := append([]float64(nil), r.Rates...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Min is the slowest run.
func (r Result) Min() float64 {
	if len(r.Rates) == 0 {
		return 0
	}
	return slices.Min(r.Rates)
}

// Max is the fastest run.
func (r Result) Max() float64 {
	if len(r.Rates) == 0 {
		return 0
	}
	return slices.Max(r.Rates)
}

// Options configure [Measure].
type Options struct {
	// Runs is how many timed runs each scenario makes (default 5).
	Runs int
	// Progress receives progress bars (nil: none).
	Progress io.Writer
}

// Measure runs every scenario opts.Runs times and returns one result per
// scenario, in order. The runs of consecutive scenarios of one group are
// interleaved (run 1 of each, then run 2 of each, ...), so that a burst of
// load from elsewhere on a shared machine slows every row of the group
// rather than one. A scenario that fails gets its error in the result and
// the others still run. A nil error means every scenario ran.
func Measure(ctx context.Context, env *Env, scenarios []*Scenario, opts *Options) ([]Result, error) {
	o := Options{Runs: 5}
	if opts != nil {
		if opts.Runs > 0 {
			o.Runs = opts.Runs
		}
		o.Progress = opts.Progress
	}
	bar := newProgress(o.Progress, len(scenarios)*o.Runs)
	results := make([]Result, len(scenarios))
	for i, s := range scenarios {
		results[i] = Result{Scenario: s}
	}
	for lo := 0; lo < len(scenarios); {
		hi := lo + 1
		for hi < len(scenarios) && scenarios[hi].Group == scenarios[lo].Group {
			hi++
		}
		measureGroup(ctx, env, scenarios[lo:hi], results[lo:hi], o.Runs, bar)
		lo = hi
	}
	bar.done()
	var errs []error
	for _, r := range results {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Scenario.ID(), r.Err))
		}
	}
	return results, errors.Join(errs...)
}

// measureGroup prepares the scenarios of one group, then makes their runs
// in turn, and fills results.
func measureGroup(ctx context.Context, env *Env, scenarios []*Scenario, results []Result, runs int, bar *progress) {
	prepared := make([]Run, len(scenarios))
	for i, s := range scenarios {
		prepared[i], results[i].Err = prepare(ctx, env, s)
		if results[i].Err != nil {
			for range runs {
				bar.step(fmt.Sprintf("%s · %s: %v", short(s.Group), s.Name, results[i].Err))
			}
		}
	}
	probe := startLoad()
	measure := func(rows []int) {
		for r := range runs {
			for _, i := range rows {
				s := scenarios[i]
				if results[i].Err != nil {
					continue
				}
				again := ""
				if results[i].Rerun {
					again = " (rerun: noisy)"
				}
				bar.step(fmt.Sprintf("%s · %s c=%d dup=%d%% run %d/%d%s", short(s.Group), s.Name, s.Concurrency, s.DupPercent, r+1, runs, again))
				rate, err := measureRun(ctx, env, s, prepared[i], r)
				if err != nil {
					results[i].Err = err
					continue
				}
				results[i].Rates = append(results[i].Rates, rate)
			}
		}
	}
	measure(indexes(len(scenarios)))
	rerunNoisy(measure, results)
	load := probe.end()
	for i := range results {
		results[i].Load = &load
	}
}

func short(group string) string {
	for i, r := range group {
		if r == ':' || r == ' ' {
			return group[:i]
		}
	}
	return group
}

// prepare checks that the servers a scenario needs are configured and
// prepares it.
func prepare(ctx context.Context, env *Env, s *Scenario) (Run, error) {
	if s.Needs&NeedsPostgres != 0 && env.PostgresURL == "" {
		return Run{}, errors.New("no PostgreSQL URL (set IDEM_POSTGRES_URL or --postgres)")
	}
	if s.Needs&NeedsRedis != 0 && env.RedisURL == "" {
		return Run{}, errors.New("no Redis URL (set IDEM_REDIS_URL or --redis)")
	}
	if s.Needs&NeedsMySQL != 0 && env.MySQLURL == "" {
		return Run{}, errors.New("no MySQL URL (set IDEM_MYSQL_URL or --mysql)")
	}
	run, err := s.Prepare(ctx, env, s)
	if err != nil {
		return Run{}, fmt.Errorf("prepare: %w", err)
	}
	return run, nil
}

// measureRun makes timed run r of s on a fresh stream and returns its
// messages per second.
func measureRun(ctx context.Context, env *Env, s *Scenario, run Run, r int) (float64, error) {
	env.streams++
	stream := NewStream(fmt.Sprintf("%s-%d", env.Prefix, env.streams), s.Messages, s.DupPercent, uint64(env.streams))
	if run.Before != nil {
		if err := run.Before(ctx, stream); err != nil {
			return 0, fmt.Errorf("run %d: before: %w", r+1, err)
		}
	}
	var rate float64
	if run.Rate != nil {
		var err error
		if rate, err = run.Rate(ctx, stream); err != nil {
			return 0, fmt.Errorf("run %d: %w", r+1, err)
		}
	} else {
		start := time.Now()
		if err := run.Exec(ctx, stream); err != nil {
			return 0, fmt.Errorf("run %d: %w", r+1, err)
		}
		rate = float64(len(stream.Keys)) / time.Since(start).Seconds()
	}
	if run.After != nil {
		if err := run.After(ctx, stream); err != nil {
			return 0, fmt.Errorf("run %d: check: %w", r+1, err)
		}
	}
	return rate, nil
}

// NewEnv returns an Env with a fresh scratch directory and prefix.
func NewEnv(postgresURL, redisURL string) (*Env, error) {
	dir, err := os.MkdirTemp("", "idembench-")
	if err != nil {
		return nil, err
	}
	e := &Env{PostgresURL: postgresURL, RedisURL: redisURL, Dir: dir, Prefix: "b" + randomSuffix()}
	e.Cleanup(func() { _ = os.RemoveAll(dir) })
	return e, nil
}
