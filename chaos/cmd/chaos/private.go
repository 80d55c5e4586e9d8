package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// private is a server of the run's own (nats-server, redis-server) on a
// free port, which the chaos loop crashes with SIGKILL and starts again on
// the same port and data directory. The shared servers are never touched.
type private struct {
	name, bin string
	args      []string
	port      int

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	restarts int
	// down is the total time the server was not accepting connections.
	down time.Duration
}

// privateServers are the servers a scenario may run privately: the binary
// and its arguments for a port and a data directory.
var privateServers = map[string]func(port int, dir string) (bin string, args []string){
	"nats": func(port int, dir string) (string, []string) {
		return "nats-server", []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", dir}
	},
	// No persistence, as a cache is often run: a crash loses every record.
	"redis": func(port int, dir string) (string, []string) {
		return "redis-server", []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--save", "",
			"--appendonly", "no", "--dir", dir, "--maxmemory-policy", "noeviction"}
	},
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// startPrivate starts the named server in a directory under dir.
func startPrivate(ctx context.Context, name, dir string) (*private, error) {
	bin, _ := privateServers[name](0, "")
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%w: %s is not installed (%v)", errMissing, bin, err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, name)
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	_, args := privateServers[name](port, data)
	p := &private{name: name, bin: path, args: args, port: port}
	if err := p.start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *private) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func (p *private) start(ctx context.Context) error {
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.addr(), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("private %s exited at start", p.name)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("private %s did not listen on %s within 30s", p.name, p.addr())
		}
	}
}

// crash SIGKILLs the server, keeps it down for pause, and starts it again.
func (p *private) crash(ctx context.Context, pause time.Duration) error {
	start := time.Now()
	p.stop()
	select {
	case <-time.After(pause):
	case <-ctx.Done():
	}
	err := p.start(context.WithoutCancel(ctx))
	p.mu.Lock()
	p.restarts++
	p.down += time.Since(start)
	p.mu.Unlock()
	return err
}

func (p *private) stop() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}
