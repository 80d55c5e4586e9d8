package main

import (
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// fleet is the worker processes of one scenario. A worker that the fleet
// killed is started again at once; one that exited by itself (it could not
// reach a server through a cut relay, say) is counted and started again
// after a pause.
type fleet struct {
	exe  string
	base spec
	log  io.Writer

	mu      sync.Mutex
	procs   []*proc
	closing bool
	wg      sync.WaitGroup

	kills, stops, exits int
	// slowestExit is the longest a worker took to exit after SIGTERM at
	// the end of the run; overdue counts those that needed a SIGKILL.
	slowestExit time.Duration
	overdue     int
}

type proc struct {
	cmd    *exec.Cmd
	killed bool
	done   chan struct{}
}

func newFleet(exe string, base spec, n int, log io.Writer) *fleet {
	f := &fleet{exe: exe, base: base, log: log, procs: make([]*proc, n)}
	for i := range n {
		f.wg.Add(1)
		go f.keep(i)
	}
	return f
}

// keep runs worker i until the fleet closes.
func (f *fleet) keep(i int) {
	defer f.wg.Done()
	for {
		s := f.base
		s.Worker = i
		cmd := exec.Command(f.exe, "worker")
		cmd.Env = append(os.Environ(), s.env())
		cmd.Stdout, cmd.Stderr = f.log, f.log
		p := &proc{cmd: cmd, done: make(chan struct{})}
		f.mu.Lock()
		if f.closing {
			f.mu.Unlock()
			return
		}
		err := cmd.Start()
		if err == nil {
			f.procs[i] = p
		}
		f.mu.Unlock()
		if err != nil {
			f.mu.Lock()
			f.exits++
			f.mu.Unlock()
			time.Sleep(time.Second)
			continue
		}
		_ = cmd.Wait()
		close(p.done)
		f.mu.Lock()
		closing, killed := f.closing, p.killed
		if !closing && !killed {
			f.exits++
		}
		f.mu.Unlock()
		if closing {
			return
		}
		if !killed {
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// running returns a random live worker, or nil.
func (f *fleet) pick() *proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return nil
	}
	p := f.procs[rand.IntN(len(f.procs))]
	if p == nil || p.killed {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	return p
}

// kill SIGKILLs a random worker; keep starts it again.
func (f *fleet) kill() {
	p := f.pick()
	if p == nil {
		return
	}
	f.mu.Lock()
	p.killed = true
	f.kills++
	f.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
}

// stop SIGSTOPs a random worker for d, then SIGCONTs it: a zombie that
// wakes up after its lease (or AckWait) still believing it holds its work.
func (f *fleet) stop(d time.Duration) {
	p := f.pick()
	if p == nil {
		return
	}
	f.mu.Lock()
	f.stops++
	f.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	time.AfterFunc(d, func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
}

// close wakes every worker, asks it to stop with SIGTERM, and SIGKILLs
// those still running after bound.
func (f *fleet) close(bound time.Duration) {
	f.mu.Lock()
	f.closing = true
	procs := append([]*proc(nil), f.procs...)
	f.mu.Unlock()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range procs {
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(bound):
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
				<-p.done
				mu.Lock()
				f.overdue++
				mu.Unlock()
			}
			mu.Lock()
			f.slowestExit = max(f.slowestExit, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	f.wg.Wait()
}
