package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Config configures [Generate].
type Config struct {
	PostgresURL string
	RedisURL    string
	// MySQLURL is a mysql:// URL or a go-sql-driver DSN.
	MySQLURL string
	// Quick runs every scenario once at QuickSizes.
	Quick bool
	// Runs per scenario (default 5; 1 in Quick mode).
	Runs int
	// Out is the Markdown report's path.
	Out string
	// Charts is the chart directory ("" = none).
	Charts string
	// Command is recorded in the report.
	Command string
	// LoadNote is recorded in the report, after the load average.
	LoadNote string
	// Progress receives progress bars (nil = none).
	Progress io.Writer
	// Filter, if set, keeps only the scenarios it returns true for.
	Filter func(*Scenario) bool
	// NoColdStart skips the cold build of the README's main job (about
	// 1½ minutes on 2 cores); Quick skips it too.
	NoColdStart bool
}

// Generate runs the scenarios and writes the report and charts. A
// scenario that fails is reported in its row and in the returned error;
// the report is written either way.
func Generate(ctx context.Context, cfg Config) (*Report, error) {
	sizes, runs := FullSizes, cfg.Runs
	if runs <= 0 {
		runs = 5
	}
	if cfg.Quick {
		sizes = QuickSizes
		if cfg.Runs <= 0 {
			runs = 1
		}
	}
	env, err := NewEnv(cfg.PostgresURL, cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	env.MySQLURL = cfg.MySQLURL
	var scenarios []*Scenario
	for _, s := range Scenarios(sizes) {
		if cfg.Filter == nil || cfg.Filter(s) {
			scenarios = append(scenarios, s)
		}
	}
	rep := &Report{Date: time.Now(), Command: cfg.Command, Runs: runs, Quick: cfg.Quick, Machine: machine(ctx, cfg)}
	if !cfg.Quick && !cfg.NoColdStart {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "cold start: go build %s with an empty GOCACHE…\n", ColdStartPackage)
		}
		rep.ColdStart = measureColdStart(ctx)
	}
	results, runErr := Measure(ctx, env, scenarios, &Options{Runs: runs, Progress: cfg.Progress})
	rep.Results = results

	var charts map[string]string
	if cfg.Charts != "" {
		if charts, err = WriteCharts(cfg.Charts, filepath.Dir(cfg.Out), results); err != nil {
			return rep, errors.Join(runErr, err)
		}
	}
	var buf bytes.Buffer
	if err := rep.WriteMarkdown(&buf, charts); err != nil {
		return rep, errors.Join(runErr, err)
	}
	if err := os.WriteFile(cfg.Out, buf.Bytes(), 0o644); err != nil {
		return rep, errors.Join(runErr, err)
	}
	return rep, runErr
}

// machine describes this host and the servers' versions; what it cannot
// read stays empty.
func machine(ctx context.Context, cfg Config) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				m.MemoryGB = kb / (1 << 20)
			}
		}
		_ = f.Close()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if cfg.PostgresURL != "" {
		if conn, err := pgx.Connect(ctx, cfg.PostgresURL); err == nil {
			_ = conn.QueryRow(ctx, "SHOW server_version").Scan(&m.Postgres)
			m.PostgresStorage = PostgresStorage(ctx, conn)
			_ = conn.Close(ctx)
		}
	}
	if cfg.MySQLURL != "" {
		m.MySQL = mysqlVersion(ctx, cfg.MySQLURL)
	}
	if cfg.RedisURL != "" {
		if opt, err := redis.ParseURL(cfg.RedisURL); err == nil {
			c := redis.NewClient(opt)
			if info, err := c.Info(ctx, "server").Result(); err == nil {
				for line := range strings.SplitSeq(info, "\n") {
					if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
						m.Redis = v
					}
				}
			}
			_ = c.Close()
		}
	}
	if l := loadAverage(); l != "" {
		m.Load = "load average at start " + l
	}
	if cfg.LoadNote != "" {
		m.Load = strings.TrimPrefix(m.Load+"; "+cfg.LoadNote, "; ")
	}
	return m
}
