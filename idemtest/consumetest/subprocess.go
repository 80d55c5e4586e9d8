package consumetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/textcut"
)

// The environment of a child process of the kill scenario.
const (
	// envChild names the test whose Run serves deliveries in this process.
	envChild = "IDEM_CONSUMETEST_CHILD"
	// envDir is the directory Dir returned in the parent.
	envDir = "IDEM_CONSUMETEST_DIR"
)

// request is one delivery sent to the child, a JSON line on its stdin.
type request struct {
	ID      string `json:"id"`
	Body    []byte `json:"body"`
	Attempt int    `json:"attempt"`
	// KillAt is the point at which the child reports and waits to be
	// killed; 0 means none.
	KillAt int `json:"kill_at,omitempty"`
}

// The child's lines on file descriptor 3: "ready", then per request
// "start", maybe "point N" (and it waits there to be killed), and
// "returned ok" or "returned error TEXT".
const (
	lineReady    = "ready"
	lineStart    = "start"
	linePoint    = "point "
	lineReturned = "returned "
	// lineDeadLettered follows lineReturned when the error wraps
	// ErrDeadLettered.
	lineDeadLettered = "dead-lettered "
)

// maxChildOutput bounds the child's output kept for failure messages.
const maxChildOutput = 16 << 10

// serveChild is Run in a child process: it delivers every request read
// from stdin to target.Deliver and reports on file descriptor 3.
func serveChild(t testing.TB, target Target, o Options) {
	out := os.NewFile(3, "consumetest")
	if out == nil {
		t.Fatalf("consumetest: started as a child process without its report pipe")
		return
	}
	defer out.Close()
	var mu sync.Mutex
	say := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := io.WriteString(out, line+"\n"); err != nil {
			os.Exit(2) // the parent is gone
		}
	}
	reqs := make(chan request)
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		defer close(reqs)
		dec := json.NewDecoder(bufio.NewReader(os.Stdin))
		for {
			var r request
			if err := dec.Decode(&r); err != nil {
				return
			}
			reqs <- r
		}
	}()
	say(lineReady)
	for r := range reqs {
		in := &injector{kind: killFault, at: r.KillAt, kill: func(n int) {
			say(linePoint + strconv.Itoa(n))
			<-gone // the parent kills this process; if it went away instead, stop
			os.Exit(3)
		}}
		say(lineStart)
		err := deliverChild(target, o, r, in)
		if errors.Is(err, ErrDeadLettered) {
			say(lineReturned + lineDeadLettered + oneLine(err.Error()))
			continue
		}
		if err != nil {
			say(lineReturned + "error " + oneLine(err.Error()))
			continue
		}
		say(lineReturned + "ok")
	}
}

// deliverChild calls Target.Deliver once in the child, recovering a panic.
func deliverChild(target Target, o Options, r request, in *injector) (err error) {
	ctx, cancelTimeout := context.WithTimeout(context.Background(), o.Timeout)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	in.cancel = cancel
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("consumetest: the handler panicked: %v", v)
		}
	}()
	return target.Deliver(context.WithValue(ctx, injectorKey{}, in), Delivery{ID: r.ID, Body: r.Body, Attempt: r.Attempt})
}

func oneLine(s string) string {
	s = strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
	if cut := textcut.Cut(s, 1024); cut != s {
		return cut + "…"
	}
	return s
}

// child is a running child process of the kill scenario.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	exited chan struct{}
	out    *tailBuffer
	err    error // Wait's, once exited is closed
}

// testPattern returns the -test.run pattern that selects exactly the test
// named name (subtests included).
func testPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// startChild starts the test binary with only this test selected and
// waits until its Run serves deliveries.
func (r *runner) startChild() (*child, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0], "-test.run="+testPattern(r.t.Name()), "-test.count=1")
	cmd.Env = append(os.Environ(), envChild+"="+r.t.Name())
	if d, ok := dirs.Load(r.t.Name()); ok {
		cmd.Env = append(cmd.Env, envDir+"="+d.(string))
	}
	c := &child{cmd: cmd, lines: make(chan string, 16), exited: make(chan struct{}), out: &tailBuffer{max: maxChildOutput}}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.ExtraFiles = []*os.File{pw}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	err = cmd.Start()
	// The child has its copy: the reader sees the end of the pipe when
	// the child exits.
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("start %s: %w", os.Args[0], err)
	}
	go func() {
		defer close(c.lines)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 4096), 64<<10)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	line, err := c.read(r.o.Timeout)
	if err == nil && line != lineReady {
		err = fmt.Errorf("the child process said %q instead of %q", line, lineReady)
	}
	if err != nil {
		c.kill()
		return nil, err
	}
	return c, nil
}

// read returns the child's next line.
func (c *child) read(timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-c.lines:
		if ok {
			return line, nil
		}
		select {
		case <-c.exited:
		case <-t.C:
		}
		return "", fmt.Errorf("the child process ended (%v); its output:\n%s", c.err, c.out)
	case <-t.C:
		return "", fmt.Errorf("no word from the child process in %v; its output:\n%s", timeout, c.out)
	}
}

// send writes one request to the child.
func (c *child) send(req request) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write to the child process: %w; its output:\n%s", err, c.out)
	}
	return nil
}

// kill SIGKILLs the child and waits until it is gone.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// stop closes the child's stdin, so that it finishes its test, and kills
// it if it has not exited within timeout.
func (c *child) stop(timeout time.Duration) {
	c.stdin.Close()
	select {
	case <-c.exited:
	case <-time.After(timeout):
		c.kill()
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (tb *tailBuffer) Write(p []byte) (int, error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.b = append(tb.b, p...)
	if over := len(tb.b) - tb.max; over > 0 {
		tb.b = append(tb.b[:0], tb.b[over:]...)
	}
	return len(p), nil
}

func (tb *tailBuffer) String() string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return string(bytes.TrimSpace(tb.b))
}

// killPlan is one message of the kill scenario: killed at point at
// (0: after delay, -1: after the handler returned, before the ack).
type killPlan struct {
	at    int
	delay time.Duration
}

func (p killPlan) String() string {
	switch {
	case p.at > 0:
		return fmt.Sprintf("SIGKILL at point %d", p.at)
	case p.at < 0:
		return "SIGKILL after the handler returned, before the ack"
	}
	return fmt.Sprintf("SIGKILL %v after the delivery started", p.delay)
}

// kill plays the kill scenario.
func (sc *scenario) kill() {
	r := sc.r
	if !r.target.Subprocess {
		sc.res.Skipped = "Target.Subprocess is not set"
		return
	}
	if runtime.GOOS == "windows" {
		sc.res.Skipped = "child processes need an extra file descriptor, which Windows does not pass"
		return
	}
	var plans []killPlan
	if r.points > 0 {
		for i := range r.points {
			plans = append(plans, killPlan{at: i + 1})
		}
	} else {
		for _, d := range r.delays(r.o.TimedFaults) {
			plans = append(plans, killPlan{delay: d})
		}
	}
	plans = append(plans, killPlan{at: -1})

	var c *child
	defer func() {
		if c != nil {
			c.stop(r.o.Timeout)
		}
	}()
	ensure := func() bool {
		if c != nil {
			return true
		}
		var err error
		if c, err = r.startChild(); err != nil {
			sc.fail("cannot start the target in a child process: %v", err)
			return false
		}
		return true
	}
	mid, afterReturn := 0, 0
	for _, p := range plans {
		if !ensure() {
			return
		}
		id := sc.newIDs(1)[0]
		returned, err := sc.killOne(c, id, p)
		c = nil // killed
		if err != nil {
			sc.fail("id %q: %v", id, err)
			return
		}
		if returned {
			afterReturn++
			sc.note(id, "%s (it landed after the handler returned), then redelivered to a restarted process", p)
		} else {
			mid++
			sc.note(id, "%s, then redelivered to a restarted process", p)
		}
		if !ensure() {
			return
		}
		if !sc.redeliverChild(c, id) {
			return
		}
	}
	sc.res.Note = fmt.Sprintf("%s: %d mid-handler, %d after the handler returned", plural(len(plans), "SIGKILL"), mid, afterReturn)
}

// killOne delivers id to c and kills c as p says. It reports whether the
// handler had returned when the kill came.
func (sc *scenario) killOne(c *child, id string, p killPlan) (returned bool, err error) {
	defer c.kill()
	req := request{ID: id, Body: sc.body(id, 0), Attempt: sc.next(id), KillAt: max(p.at, 0)}
	sc.failed() // killed, whatever it does
	if err := c.send(req); err != nil {
		return false, err
	}
	if line, err := c.read(sc.r.o.Timeout); err != nil {
		return false, err
	} else if line != lineStart {
		return false, fmt.Errorf("the child process said %q instead of %q", line, lineStart)
	}
	if p.at == 0 {
		time.Sleep(p.delay)
		c.kill()
		for line := range c.lines {
			if strings.HasPrefix(line, lineReturned) {
				returned = true
			}
		}
		return returned, nil
	}
	line, err := c.read(sc.r.o.Timeout)
	if err != nil {
		return false, err
	}
	switch {
	case strings.HasPrefix(line, linePoint):
		return false, nil
	case strings.HasPrefix(line, lineReturned):
		if p.at > 0 {
			sc.note(id, "point %d of %d not reached", p.at, sc.r.points)
		}
		return true, nil
	}
	return false, fmt.Errorf("the child process said %q", line)
}

// redeliverChild delivers id to c until the handler returns nil.
func (sc *scenario) redeliverChild(c *child, id string) bool {
	pause := 5 * time.Millisecond
	last := ""
	for range sc.r.o.MaxAttempts {
		req := request{ID: id, Body: sc.body(id, 0), Attempt: sc.next(id)}
		if err := c.send(req); err != nil {
			sc.fail("id %q: %v", id, err)
			return false
		}
		for {
			line, err := c.read(sc.r.o.Timeout)
			if err != nil {
				sc.fail("id %q: %v", id, err)
				return false
			}
			if line == lineStart {
				continue
			}
			last = strings.TrimPrefix(line, lineReturned)
			break
		}
		if last == "ok" {
			return true
		}
		if strings.HasPrefix(last, lineDeadLettered) {
			sc.failed()
			sc.note(id, "%s in the restarted process", strings.TrimSpace(last))
			return true
		}
		sc.failed()
		time.Sleep(pause)
		pause = min(2*pause, 250*time.Millisecond)
	}
	sc.fail("id %q: still failing after %s in a restarted process: %s", id, plural(sc.r.o.MaxAttempts, "delivery"), last)
	return false
}
