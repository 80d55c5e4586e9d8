// Command proxystorm sends a storm of distinct Idempotency-Keys through a
// running `idem proxy` for a while and samples the proxy's resident memory
// (VmRSS of its process), to show that nothing in the proxy grows without
// bound: the replay cache, maps and pools all have limits. It is the long
// proxy benchmark of issue 21, not part of CI.
//
//	go build -o /tmp/idem ./cmd/idem            # from the repository root
//	go run ./cmd/proxystorm --idem /tmp/idem --duration 10m --every 30s
//
// It starts a durable upstream (one fsync'd SQLite row per request) and the
// proxy over a fresh SQLite store (migrated first), sends POSTs with
// distinct keys from --clients keep-alive clients, replays every tenth key
// once, and prints one line per sample: elapsed time, requests so far,
// requests per second since the last sample and the proxy's RSS in MiB.
// Linux only (it reads /proc/PID/status).
package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/store/idemsqlite"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "proxystorm:", err)
		os.Exit(1)
	}
}

func run() error {
	idemBin := flag.String("idem", "", "path of the idem binary (required)")
	duration := flag.Duration("duration", 10*time.Minute, "how long the storm lasts")
	every := flag.Duration("every", 30*time.Second, "how often RSS is sampled")
	clients := flag.Int("clients", 16, "concurrent keep-alive clients")
	flag.Parse()
	if *idemBin == "" || *duration <= 0 || *every <= 0 || *clients <= 0 {
		return errors.New("--idem is required; --duration, --every and --clients must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dir, err := os.MkdirTemp("", "proxystorm-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// The durable upstream.
	db, err := idemsqlite.OpenDB(ctx, filepath.Join(dir, "payments.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, "CREATE TABLE payments (id TEXT PRIMARY KEY)"); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	up := &http.Server{Handler: upstream(db), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = up.Serve(ln) }()
	defer up.Close()

	// The proxy, as an operator runs it.
	store := "sqlite://" + filepath.Join(dir, "idem.db")
	if out, err := exec.CommandContext(ctx, *idemBin, "migrate", "up", "--store", store).CombinedOutput(); err != nil {
		return fmt.Errorf("idem migrate up: %v: %s", err, out)
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	proxy := exec.Command(*idemBin, "proxy", "--upstream", "http://"+ln.Addr().String(), "--store", store,
		"--listen", addr, "--scope-header", "X-Tenant")
	proxy.Stderr = io.Discard // one log line per request
	if err := proxy.Start(); err != nil {
		return err
	}
	defer func() { _ = proxy.Process.Kill(); _ = proxy.Wait() }()
	if err := waitListening(ctx, addr); err != nil {
		return err
	}

	var sent, failed atomic.Int64
	stormCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var wg sync.WaitGroup
	for c := range *clients {
		wg.Go(func() {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for i := 0; stormCtx.Err() == nil; i++ {
				key := fmt.Sprintf("storm-%d-%d", c, i)
				for try := range 1 + boolInt(i%10 == 0) { // every tenth key is replayed once
					if err := post(stormCtx, client, "http://"+addr, key); err != nil && stormCtx.Err() == nil {
						failed.Add(1)
						if failed.Load() <= 3 {
							fmt.Fprintf(os.Stderr, "key %s try %d: %v\n", key, try, err)
						}
					}
					sent.Add(1)
				}
			}
		})
	}
	start, last, lastSent := time.Now(), time.Now(), int64(0)
	fmt.Printf("%8s %10s %8s %8s\n", "elapsed", "requests", "req/s", "RSS MiB")
	sample := func() {
		now, n := time.Now(), sent.Load()
		rss, err := rssMiB(proxy.Process.Pid)
		if err != nil {
			fmt.Fprintln(os.Stderr, "rss:", err)
		}
		fmt.Printf("%8s %10d %8.0f %8.1f\n", now.Sub(start).Round(time.Second), n, float64(n-lastSent)/now.Sub(last).Seconds(), rss)
		last, lastSent = now, n
	}
	sample()
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for stormCtx.Err() == nil {
		select {
		case <-tick.C:
			sample()
		case <-stormCtx.Done():
		}
	}
	wg.Wait()
	if time.Since(last) > time.Second {
		sample()
	}
	fmt.Printf("failed requests: %d\n", failed.Load())
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func upstream(db *sql.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if _, err := db.ExecContext(r.Context(), "INSERT INTO payments (id) VALUES (?)", r.Header.Get("Idempotency-Key")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"pay_1","status":"succeeded"}`))
	})
}

func post(ctx context.Context, client *http.Client, base, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments", bytes.NewReader([]byte(`{"amount":100}`)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", "storm")
	req.Header.Set("Idempotency-Key", strconv.Quote(key))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitListening(ctx context.Context, addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the proxy does not listen on %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rssMiB reads VmRSS of process pid.
func rssMiB(pid int) (float64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, errors.New("no VmRSS")
}
