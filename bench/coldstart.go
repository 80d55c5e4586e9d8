package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ColdStartPackage is what the README's main job, `go run ./cmd/idem/demo`,
// compiles: the demo on its own (idem, idemhttp, idemsqlite and the
// standard library), about half of what the whole CLI (./cmd/idem, whose
// `idem demo` runs the same demo) needs.
const ColdStartPackage = "./cmd/idem/demo"

// ColdStartTarget is issue 21's bound on the main job's first build, in
// wall time on 2 idle cores.
const ColdStartTarget = 60 * time.Second

// ColdStart is one `go build` with an empty build cache: what the first
// `go run` of a command costs on a fresh checkout (the module cache is warm,
// so downloads are not counted).
type ColdStart struct {
	// Package is the import path or pattern built, relative to Dir.
	Package string
	// Dir is where go build ran (the repository root).
	Dir string
	// Wall is the build's wall time.
	Wall time.Duration
	// User and Sys are the CPU time of go build and of every compiler and
	// linker it ran (the child's rusage, which counts its waited-for
	// children).
	User, Sys time.Duration
	// Load is the load average (1, 5, 15 minutes) read just before.
	Load string
	// Err is why the build failed or was not measured.
	Err error
}

// CPU is user + system CPU time.
func (c *ColdStart) CPU() time.Duration { return c.User + c.Sys }

// Met reports whether the build took less than [ColdStartTarget].
func (c *ColdStart) Met() bool { return c.Err == nil && c.Wall > 0 && c.Wall < ColdStartTarget }

// MeasureColdStart runs `go build -o TMP pkg` once in dir with GOCACHE set to
// a new, empty temporary directory, which it removes afterwards. The
// dependencies are listed first with the normal cache so that the timed build
// downloads nothing. A build that fails is returned with Err set (and its
// output in Err) and a nil error; the error is for what kept it from running.
func MeasureColdStart(ctx context.Context, dir, pkg string) (*ColdStart, error) {
	tmp, err := os.MkdirTemp("", "idembench-coldstart-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	c := &ColdStart{Package: pkg, Dir: dir}
	list := exec.CommandContext(ctx, "go", "list", "-deps", "-e", pkg)
	list.Dir = dir
	if out, err := list.CombinedOutput(); err != nil {
		c.Err = fmt.Errorf("go list -deps %s: %w: %s", pkg, err, bytes.TrimSpace(out))
		return c, nil
	}
	c.Load = loadAverage()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(tmp, "out"), pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOCACHE="+filepath.Join(tmp, "cache"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	c.Wall = time.Since(start)
	if ps := cmd.ProcessState; ps != nil {
		c.User, c.Sys = ps.UserTime(), ps.SystemTime()
	}
	if runErr != nil {
		if ctx.Err() != nil {
			return c, ctx.Err()
		}
		c.Err = fmt.Errorf("go build %s: %w: %s", pkg, runErr, bytes.TrimSpace(out.Bytes()))
	}
	return c, nil
}

// repoRoot is the directory of the go.work file in effect here: the
// repository root, where the README's commands run.
func repoRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOWORK").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOWORK: %w", err)
	}
	work := strings.TrimSpace(string(out))
	if work == "" || work == "off" {
		return "", errors.New("not in the repository's workspace (go env GOWORK is empty)")
	}
	return filepath.Dir(work), nil
}

// measureColdStart is [Generate]'s step: the README main job's cold build
// from the repository root. It never fails the run: what went wrong is in
// the section.
func measureColdStart(ctx context.Context) *ColdStart {
	root, err := repoRoot(ctx)
	if err != nil {
		return &ColdStart{Package: ColdStartPackage, Err: err}
	}
	c, err := MeasureColdStart(ctx, root, ColdStartPackage)
	if err != nil && c == nil {
		c = &ColdStart{Package: ColdStartPackage, Dir: root}
	}
	if err != nil {
		c.Err = err
	}
	return c
}

// loadAverage is /proc/loadavg's first three fields, or "" where there is
// none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// fmtSeconds formats d as seconds with one decimal, and as minutes and
// seconds from a minute up.
func fmtSeconds(d time.Duration) string {
	s := fmt.Sprintf("%.1f s", d.Seconds())
	if d >= time.Minute {
		s += fmt.Sprintf(" (%dm%04.1fs)", int(d.Minutes()), d.Seconds()-60*float64(int(d.Minutes())))
	}
	return s
}

// markdown writes the report's "Cold start" section.
func (c *ColdStart) markdown(b *strings.Builder) {
	b.WriteString("## Cold start\n\n")
	fmt.Fprintf(b, "The README's main job, `go run ./cmd/idem/demo`, compiles the demo and its dependencies "+
		"on first run. Measured as `go build %s` from the repository root with an empty, temporary build "+
		"cache (`GOCACHE`), once; the module cache was warm, so downloads are not counted. CPU time is "+
		"the build's own rusage (go, compile and link processes).\n\n", c.Package)
	if c.Err != nil {
		fmt.Fprintf(b, "Not measured: %s.\n\n", strings.ReplaceAll(firstLine(c.Err.Error()), "|", "/"))
		return
	}
	mark := "met"
	if !c.Met() {
		mark = "**not met**"
	}
	b.WriteString("| Build | Wall | CPU user + sys | Load before (1, 5, 15 min) | Goal | |\n|---|---:|---:|---|---:|---|\n")
	fmt.Fprintf(b, "| `go build %s`, empty GOCACHE | %s | %.0f s + %.0f s = %.0f s | %s | < %.0f s | %s |\n\n",
		c.Package, fmtSeconds(c.Wall), c.User.Seconds(), c.Sys.Seconds(), c.CPU().Seconds(), orNA(c.Load),
		ColdStartTarget.Seconds(), mark)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}
