package main

// End-to-end fault tests of "idem proxy": the real binary as its own
// process, on each real store, with fault-injecting relays on the wire
// between the client and the proxy and between the proxy and the upstream,
// an upstream that counts its executions per key, and a client that retries
// the way SDKs do. Every case asserts the exact number of executions.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/faultnet"
)

// sharedBinary builds the idem binary once for the whole package run; the
// directory is removed by TestMain.
var sharedBinary struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func idemBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	sharedBinary.once.Do(func() {
		sharedBinary.dir, sharedBinary.err = os.MkdirTemp("", "idem-bin-")
		if sharedBinary.err != nil {
			return
		}
		sharedBinary.path = filepath.Join(sharedBinary.dir, "idem")
		out, err := exec.Command("go", "build", "-o", sharedBinary.path, ".").CombinedOutput()
		if err != nil {
			sharedBinary.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if sharedBinary.err != nil {
		t.Fatal(sharedBinary.err)
	}
	return sharedBinary.path
}

func removeSharedBinary() {
	if sharedBinary.dir != "" {
		_ = os.RemoveAll(sharedBinary.dir)
	}
}

// proxyStores are the stores the proxy runs on in these tests. args
// returns the store flags of a fresh, migrated store of that kind.
var proxyStores = []struct {
	name string
	args func(t *testing.T) []string
}{
	{"sqlite", func(t *testing.T) []string { return []string{"--store", migratedSQLite(t)} }},
	{"postgres", func(t *testing.T) []string {
		url := postgresURL(t)
		schema := testSchema(t, url)
		wantExit(t, runCLI(t, nil, "migrate", "up", "--store", url, "--schema", schema), exitOK)
		return []string{"--store", url, "--schema", schema}
	}},
	{"redis", func(t *testing.T) []string { return []string{"--store", redisTestDSN(t)} }},
}

// countingUpstream is a non-idempotent API: every request it reads is an
// execution, counted per Idempotency-Key. The X-Test request header picks
// its behaviour: "sleep=DURATION", "sse" (an event stream of five events),
// "fail-first" (500 on the first execution of a key).
type countingUpstream struct {
	t    *testing.T
	addr string

	mu       sync.Mutex
	srv      *http.Server
	execs    map[string]int
	arrivals chan string // the key of every request, as it arrives
}

func newCountingUpstream(t *testing.T) *countingUpstream {
	t.Helper()
	u := &countingUpstream{t: t, execs: map[string]int{}, arrivals: make(chan string, 10000)}
	u.start("127.0.0.1:0")
	t.Cleanup(u.stop)
	return u
}

func (u *countingUpstream) start(addr string) {
	u.t.Helper()
	var (
		ln  net.Listener
		err error
	)
	// The port of a stopped upstream may take a moment to be free again.
	for range 50 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		u.t.Fatalf("upstream listen: %v", err)
	}
	srv := &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	u.mu.Lock()
	u.addr, u.srv = ln.Addr().String(), srv
	u.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

// stop closes the listener and every connection: the port refuses
// connections until start.
func (u *countingUpstream) stop() {
	u.mu.Lock()
	srv := u.srv
	u.mu.Unlock()
	_ = srv.Close()
}

func (u *countingUpstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.execs[key]
}

// waitArrival waits until a request with key reaches the upstream.
func (u *countingUpstream) waitArrival(t *testing.T, key string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case k := <-u.arrivals:
			if k == key {
				return
			}
		case <-deadline:
			t.Fatalf("the request with key %q never reached the upstream", key)
		}
	}
}

func (u *countingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // not a whole request: not an execution
	}
	u.mu.Lock()
	u.execs[key]++
	n := u.execs[key]
	u.mu.Unlock()
	select {
	case u.arrivals <- key:
	default:
	}
	mode := r.Header.Get("X-Test")
	// Like most real services, the upstream does not stop working when its
	// caller goes away.
	switch {
	case strings.HasPrefix(mode, "sleep="):
		d, _ := time.ParseDuration(strings.TrimPrefix(mode, "sleep="))
		time.Sleep(d)
	case mode == "fail-first" && n == 1:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, `{"error":"transient","key":%q}`, key)
		return
	case mode == "sse":
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Request-Id", fmt.Sprintf("req_%s_%d", key, n))
		w.WriteHeader(http.StatusCreated)
		for i := range 5 {
			fmt.Fprintf(w, "data: {\"key\":%q,\"execution\":%d,\"event\":%d}\n\n", key, n, i)
			_ = http.NewResponseController(w).Flush()
			time.Sleep(150 * time.Millisecond)
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%s_%d", key, n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"key":%q,"execution":%d,"bytes":%d}`, key, n, len(body))
}

// proxyProc is an "idem proxy" process.
type proxyProc struct {
	cmd    *exec.Cmd
	base   string
	addr   string
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
}

func startProxyProc(t *testing.T, args ...string) *proxyProc {
	t.Helper()
	cmd := exec.Command(idemBinary(t), append([]string{"proxy", "--listen", "127.0.0.1:0"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	p := &proxyProc{cmd: cmd, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	out := p.stdout
	cmd.Stdout, cmd.Stderr = out, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.done })
	p.base = waitListening(t, out, p.done)
	p.addr = strings.TrimPrefix(p.base, "http://")
	return p
}

var adminRE = regexp.MustCompile(`admin \(/healthz, /readyz, /metrics\) on (\S+)`)

// heartbeats scrapes the proxy's /metrics (it must run with
// --admin-listen) and returns how many executions sent heartbeats and the
// upper bound of the bucket that holds the slowest of them.
func (p *proxyProc) heartbeats(t *testing.T) (executions int, slowest string) {
	t.Helper()
	m := adminRE.FindStringSubmatch(p.stdout.String())
	if m == nil {
		t.Fatalf("the proxy printed no admin address: %s", p.stdout.String())
	}
	resp, err := http.Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// Buckets are cumulative and in increasing order: the slowest
	// heartbeat is in the first bucket that holds them all.
	type bucket struct {
		le string
		n  int
	}
	var buckets []bucket
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "idem_guard_heartbeat_max_seconds_bucket{") {
			continue
		}
		le := line[strings.Index(line, `le="`)+4:]
		n, _ := strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
		buckets = append(buckets, bucket{le[:strings.IndexByte(le, '"')], n})
	}
	if len(buckets) == 0 {
		return 0, "none"
	}
	executions = buckets[len(buckets)-1].n
	for _, bk := range buckets {
		if bk.n == executions {
			return executions, "≤" + bk.le + "s"
		}
	}
	return executions, "?"
}

func (p *proxyProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// outcomes counts the proxy's request log lines by outcome, and its
// warnings and errors by message ("log:" and the message).
func (p *proxyProc) outcomes() map[string]int {
	counts := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg     string `json:"msg"`
			Outcome string `json:"outcome"`
			Level   string `json:"level"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		switch {
		case line.Msg == "request":
			counts[line.Outcome]++
		case line.Level == "WARN" || line.Level == "ERROR":
			counts["log:"+line.Msg]++
		}
	}
	return counts
}

// checkHealthyLog fails if the proxy lost a lease, could not record a
// response or saw a slow or failed heartbeat, and then shows the first
// of those warnings whole (how long the heartbeat took, its error).
func (p *proxyProc) checkHealthyLog(t *testing.T) {
	t.Helper()
	unhealthy := func(o string) bool {
		return o == string(idem.NotRecorded) || o == string(idem.Errored) ||
			strings.Contains(o, "heartbeat") || strings.Contains(o, "lease may expire") || strings.Contains(o, "could not be recorded")
	}
	failed := false
	for o, n := range p.outcomes() {
		if unhealthy(o) {
			t.Errorf("proxy log: %d × %q", n, o)
			failed = true
		}
	}
	if !failed {
		return
	}
	shown := 0
	for line := range strings.Lines(p.stderr.String()) {
		var l struct{ Msg, Level, Outcome string }
		if shown == 5 || json.Unmarshal([]byte(line), &l) != nil {
			continue
		}
		if l.Msg == "request" && unhealthy(l.Outcome) || (l.Level == "WARN" || l.Level == "ERROR") && unhealthy("log:"+l.Msg) {
			t.Logf("proxy log line: %s", strings.TrimSpace(line))
			shown++
		}
	}
}

// sdkClient retries as payment SDKs do: the same key on a network error, a
// 409 and a 5xx that says nothing ran (502/504 upstream-unreachable or
// -timeout, 503, 500), with a growing, jittered pause; it gives up on an
// outcome-unknown answer or any other status, or after a minute.
type sdkClient struct {
	base, auth string
	hc         *http.Client
}

func newSDKClient(t *testing.T, base string, timeout time.Duration) *sdkClient {
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &sdkClient{base: base, auth: "Bearer sk_test_" + t.Name(), hc: &http.Client{Transport: tr, Timeout: timeout}}
}

// once sends one request; err is a transport error (the client's
// timeout, a dropped connection).
func (c *sdkClient) once(ctx context.Context, key, mode, body string) (proxyResponse, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/charges", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", c.auth)
	req.Header.Set("Idempotency-Key", key)
	if mode != "" {
		req.Header.Set("X-Test", mode)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return proxyResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return proxyResponse{}, err
	}
	return proxyResponse{resp.StatusCode, resp.Header, string(b)}, nil
}

// retryable says whether an SDK would send the same request again.
func retryable(r proxyResponse) bool {
	if strings.Contains(r.body, "outcome-unknown") {
		return false
	}
	switch r.status {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// call sends the request until an answer an SDK would not retry, and
// returns it with the number of attempts.
func (c *sdkClient) call(t *testing.T, key, mode, body string) (proxyResponse, int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	pause := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		r, err := c.once(context.Background(), key, mode, body)
		if err == nil && !retryable(r) {
			return r, attempt
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q: no final answer after %d attempts: %d %s %v", key, attempt, r.status, r.body, err)
		}
		time.Sleep(pause/2 + rand.N(pause))
		pause = min(2*pause, 800*time.Millisecond)
	}
}

// proxyRig is one store's setup: upstream ← relay ← proxy ← relay ← client.
type proxyRig struct {
	up        *countingUpstream
	toUp      *faultnet.Relay // between the proxy and the upstream
	proxy     *proxyProc
	toProxy   *faultnet.Relay // between the client and the proxy
	storeArgs []string
}

func newProxyRig(t *testing.T, storeArgs []string, args ...string) *proxyRig {
	t.Helper()
	rig := &proxyRig{up: newCountingUpstream(t), storeArgs: storeArgs}
	var err error
	if rig.toUp, err = faultnet.Start(rig.up.addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rig.toUp.Close() })
	rig.proxy = startProxyProc(t, append(append([]string{"--upstream", rig.toUp.URL()}, storeArgs...), args...)...)
	if rig.toProxy, err = faultnet.Start(rig.proxy.addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rig.toProxy.Close() })
	return rig
}

// nextUpstreamConn gives f to the proxy's next connection to the upstream,
// closing the ones it keeps alive so that the next request opens one.
func (rig *proxyRig) nextUpstreamConn(f faultnet.Fault) {
	rig.toUp.SetNext(1, f)
	rig.toUp.CloseConns()
}

func uniqueKey(name string) string { return fmt.Sprintf("%s-%08x", name, rand.Uint32()) }

// wantExecutions fails unless the upstream executed key exactly n times.
func wantExecutions(t *testing.T, up *countingUpstream, key string, n int) {
	t.Helper()
	if got := up.executions(key); got != n {
		t.Errorf("key %q: the upstream executed it %d times, want %d", key, got, n)
	}
}

// wantFinal fails unless r is the 201 of execution 1 of key.
func wantFinal(t *testing.T, r proxyResponse, key string) {
	t.Helper()
	if r.status != http.StatusCreated || !strings.Contains(r.body, fmt.Sprintf(`"key":%q,"execution":1`, key)) ||
		r.header.Get("Idempotency-Key") != key {
		t.Errorf("key %q: final answer %d %s %v, want the 201 of its one execution", key, r.status, r.body, r.header)
	}
}

// TestProxyFaults runs the faults a client, the network and the upstream
// produce against the proxy on each store, and counts executions.
func TestProxyFaults(t *testing.T) {
	t.Parallel()
	for _, st := range proxyStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			rig := newProxyRig(t, st.args(t), "--timeout", "3s")
			counts := map[string]int{}
			defer func() {
				t.Logf("%s: executions per case %v; proxy outcomes %v", st.name, counts, rig.proxy.outcomes())
			}()
			check := func(name, key string, want int) {
				t.Helper()
				wantExecutions(t, rig.up, key, want)
				counts[name] = rig.up.executions(key)
			}

			// The client drops its connection once the upstream has the
			// request (as a client that gives up or crashes does).
			t.Run("client drops after forwarding", func(t *testing.T) {
				key, c := uniqueKey("drop"), newSDKClient(t, rig.toProxy.URL(), 0)
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() { _, err := c.once(ctx, key, "sleep=1500ms", `{"amount":100}`); errc <- err }()
				rig.up.waitArrival(t, key)
				cancel()
				if err := <-errc; err == nil {
					t.Fatal("the dropped request got an answer")
				}
				r, _ := c.call(t, key, "sleep=1500ms", `{"amount":100}`)
				wantFinal(t, r, key)
				check("client drops after forwarding", key, 1)
			})

			t.Run("client times out", func(t *testing.T) {
				key := uniqueKey("timeout")
				c := newSDKClient(t, rig.toProxy.URL(), 400*time.Millisecond)
				if _, err := c.once(context.Background(), key, "sleep=1500ms", `{"amount":1}`); err == nil {
					t.Fatal("a 400ms client got the answer of a 1.5s upstream")
				}
				r, attempts := c.call(t, key, "sleep=1500ms", `{"amount":1}`)
				wantFinal(t, r, key)
				if attempts < 1 {
					t.Error("no attempts")
				}
				check("client times out", key, 1)
			})

			// An event stream whose client leaves after the 201 and two
			// events: the stream runs to its end and is replayed whole.
			t.Run("event stream client leaves", func(t *testing.T) {
				key, c := uniqueKey("sse"), newSDKClient(t, rig.toProxy.URL(), 0)
				req, _ := http.NewRequest(http.MethodPost, c.base+"/v1/charges", strings.NewReader(`{}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", c.auth)
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("X-Test", "sse")
				resp, err := c.hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != http.StatusCreated {
					t.Fatalf("stream: %d", resp.StatusCode)
				}
				sc := bufio.NewScanner(resp.Body)
				for events := 0; events < 2 && sc.Scan(); {
					if strings.HasPrefix(sc.Text(), "data:") {
						events++
					}
				}
				resp.Body.Close()
				c.hc.Transport.(*http.Transport).CloseIdleConnections()
				r, _ := c.call(t, key, "sse", `{}`)
				if r.status != http.StatusCreated || strings.Count(r.body, "data:") != 5 || r.header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("replay of the stream: %d %q", r.status, r.body)
				}
				check("event stream client leaves", key, 1)
			})

			// The network between client and proxy breaks while the
			// response is on its way.
			t.Run("client connection cut mid-response", func(t *testing.T) {
				key, c := uniqueKey("cutresp"), newSDKClient(t, rig.toProxy.URL(), 0)
				rig.toProxy.SetNext(1, faultnet.Fault{CutAfterResponse: 30, CutTarget: true})
				if _, err := c.once(context.Background(), key, "", `{"amount":7}`); err == nil {
					t.Fatal("a cut response arrived whole")
				}
				r, _ := c.call(t, key, "", `{"amount":7}`)
				wantFinal(t, r, key)
				check("client connection cut mid-response", key, 1)
			})

			t.Run("slow client network", func(t *testing.T) {
				key, c := uniqueKey("slow"), newSDKClient(t, rig.toProxy.URL(), 0)
				rig.toProxy.Set(faultnet.Fault{RequestDelay: 30 * time.Millisecond, ResponseDelay: 30 * time.Millisecond})
				defer rig.toProxy.Set(faultnet.Fault{})
				r, attempts := c.call(t, key, "", `{"amount":3}`)
				wantFinal(t, r, key)
				if attempts != 1 {
					t.Errorf("%d attempts through a slow network", attempts)
				}
				check("slow client network", key, 1)
			})

			// The upstream is down (connection refused): nothing ran, the
			// key is released, and the retry once it is back runs it once.
			t.Run("upstream down then back", func(t *testing.T) {
				// A proxy with no relay in front of the upstream, so that a
				// stopped upstream refuses the connection itself.
				direct := startProxyProc(t, append([]string{"--upstream", "http://" + rig.up.addr}, rig.storeArgs...)...)
				key, c := uniqueKey("down"), newSDKClient(t, direct.base, 0)
				rig.up.stop()
				r, err := c.once(context.Background(), key, "", `{"amount":5}`)
				if err != nil || r.status != http.StatusBadGateway || !strings.Contains(r.body, "upstream-unreachable") {
					t.Errorf("upstream down: %d %s %v", r.status, r.body, err)
				}
				rig.up.start(rig.up.addr)
				r, _ = c.call(t, key, "", `{"amount":5}`)
				wantFinal(t, r, key)
				check("upstream down then back", key, 1)
			})

			// The upstream accepts the connection and resets it. Whether
			// any of the request left the proxy decides: released and run
			// once on the retry, or in doubt and never forwarded again.
			// Either way it never runs twice.
			t.Run("upstream resets the connection", func(t *testing.T) {
				key, c := uniqueKey("reset"), newSDKClient(t, rig.toProxy.URL(), 0)
				rig.nextUpstreamConn(faultnet.Fault{Refuse: true})
				r, _ := c.call(t, key, "", `{"amount":9}`)
				switch {
				case strings.Contains(r.body, "outcome-unknown"):
					check("upstream resets the connection", key, 0)
				default:
					wantFinal(t, r, key)
					check("upstream resets the connection", key, 1)
				}
			})

			// The upstream executes the request, but its answer never comes
			// back: after --timeout the outcome is unknown, recorded and
			// replayed; the request is not forwarded again.
			t.Run("upstream answer lost", func(t *testing.T) {
				key, c := uniqueKey("hang"), newSDKClient(t, rig.toProxy.URL(), 0)
				rig.nextUpstreamConn(faultnet.Fault{Hang: true})
				first, _ := c.call(t, key, "", `{"amount":11}`)
				if first.status != http.StatusGatewayTimeout || !strings.Contains(first.body, "outcome-unknown") {
					t.Fatalf("lost answer: %d %s", first.status, first.body)
				}
				for range 3 {
					if r, _ := c.call(t, key, "", `{"amount":11}`); r.status != first.status || r.body != first.body ||
						r.header.Get("Idempotent-Replayed") != "true" {
						t.Fatalf("retry after a lost answer: %d %s", r.status, r.body)
					}
				}
				check("upstream answer lost", key, 1)
			})

			// The upstream's response breaks off after a few bytes: it ran,
			// so the outcome is unknown, recorded and replayed.
			t.Run("upstream response broken", func(t *testing.T) {
				key, c := uniqueKey("broken"), newSDKClient(t, rig.toProxy.URL(), 0)
				rig.nextUpstreamConn(faultnet.Fault{CutAfterResponse: 20, CutTarget: true})
				first, _ := c.call(t, key, "", `{"amount":13}`)
				if first.status != http.StatusBadGateway || !strings.Contains(first.body, "outcome-unknown") {
					t.Fatalf("broken answer: %d %s", first.status, first.body)
				}
				if r, _ := c.call(t, key, "", `{"amount":13}`); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("retry after a broken answer: %d %s", r.status, r.body)
				}
				check("upstream response broken", key, 1)
			})

			// A 5xx says the upstream failed: the key is released and the
			// retry runs again (the documented storage policy), once.
			t.Run("upstream 5xx then success", func(t *testing.T) {
				key, c := uniqueKey("5xx"), newSDKClient(t, rig.toProxy.URL(), 0)
				r, attempts := c.call(t, key, "fail-first", `{"amount":17}`)
				if r.status != http.StatusCreated || !strings.Contains(r.body, `"execution":2`) || attempts < 2 {
					t.Errorf("after a 500: %d %s in %d attempts", r.status, r.body, attempts)
				}
				check("upstream 5xx then success", key, 2)
			})

			rig.proxy.checkHealthyLog(t)
		})
	}
}

// TestProxyCrashWindow measures the one window the proxy cannot close: it
// is SIGKILLed after the upstream ran the request and before the response
// was recorded. The key stays claimed until its lease expires (409 until
// then); after that the retry runs the request a second time. Exactly two
// executions: the window, and nothing more.
func TestProxyCrashWindow(t *testing.T) {
	t.Parallel()
	for _, st := range proxyStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			storeArgs := st.args(t)
			rig := newProxyRig(t, storeArgs, "--lease", "2s")
			key := uniqueKey("crash")
			// The upstream runs the request; its answer is held on the wire.
			rig.nextUpstreamConn(faultnet.Fault{Hang: true})
			c := newSDKClient(t, rig.proxy.base, 0)
			go func() { _, _ = c.once(context.Background(), key, "", `{"amount":21}`) }()
			rig.up.waitArrival(t, key)
			rig.proxy.kill(t)

			p2 := startProxyProc(t, append([]string{"--upstream", rig.toUp.URL(), "--lease", "2s"}, storeArgs...)...)
			c2 := newSDKClient(t, p2.base, 0)
			if r, err := c2.once(context.Background(), key, "", `{"amount":21}`); err != nil || r.status != http.StatusConflict {
				t.Fatalf("retry right after the crash: %d %s %v, want 409 until the lease expires", r.status, r.body, err)
			}
			r, _ := c2.call(t, key, "", `{"amount":21}`)
			if r.status != http.StatusCreated || !strings.Contains(r.body, `"execution":2`) {
				t.Fatalf("retry after the lease expired: %d %s", r.status, r.body)
			}
			if again, _ := c2.call(t, key, "", `{"amount":21}`); again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the second execution is not replayed: %d %s", again.status, again.body)
			}
			wantExecutions(t, rig.up, key, 2)
			t.Logf("%s: crash between the upstream's answer and the record: %d executions (the documented window)", st.name, rig.up.executions(key))
		})
	}
}

// TestProxyLoad is the report's load case: 300 concurrent clients against
// an upstream that takes 3 s, each client timing out after 1 s and retrying
// its key until it gets the answer, with the default lease and with the 2 s
// lease that lost leases before heartbeats had a priority path. No lease may
// be lost and no key run twice.
func TestProxyLoad(t *testing.T) {
	t.Parallel()
	const clients, keysEach = 300, 3
	for _, st := range proxyStores {
		for _, lease := range []string{"30s", "2s"} {
			t.Run(st.name+"/lease "+lease, func(t *testing.T) {
				t.Parallel()
				rig := newProxyRig(t, st.args(t), "--max-conns", "2048", "--lease", lease, "--admin-listen", "127.0.0.1:0")
				var wg sync.WaitGroup
				keys := make([][]string, clients)
				for i := range clients {
					wg.Go(func() {
						c := newSDKClient(t, rig.proxy.base, time.Second)
						for k := range keysEach {
							key := fmt.Sprintf("load-%d-%d-%08x", i, k, rand.Uint32())
							keys[i] = append(keys[i], key)
							r, _ := c.call(t, key, "sleep=3s", fmt.Sprintf(`{"client":%d,"n":%d}`, i, k))
							wantFinal(t, r, key)
						}
					})
				}
				wg.Wait()
				twice := 0
				for _, ks := range keys {
					for _, key := range ks {
						if n := rig.up.executions(key); n != 1 {
							twice++
							t.Errorf("key %q executed %d times", key, n)
						}
					}
				}
				hb, slowest := rig.proxy.heartbeats(t)
				t.Logf("%s, lease %s: %d keys, %d executed more than once; %d executions sent heartbeats, the slowest %s; proxy outcomes %v",
					st.name, lease, clients*keysEach, twice, hb, slowest, rig.proxy.outcomes())
				rig.proxy.checkHealthyLog(t)
			})
		}
	}
}

// TestProxyThreeInstances spreads one storm over three proxies on one
// store: every key runs once, every other answer is its replay or a 409.
func TestProxyThreeInstances(t *testing.T) {
	t.Parallel()
	const keys, copies = 20, 30
	for _, st := range proxyStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			storeArgs := st.args(t)
			up := newCountingUpstream(t)
			var procs []*proxyProc
			for range 3 {
				procs = append(procs, startProxyProc(t, append([]string{"--upstream", "http://" + up.addr}, storeArgs...)...))
			}
			type answer struct {
				r   proxyResponse
				err error
			}
			answers := make([][]answer, keys)
			names := make([]string, keys)
			var wg sync.WaitGroup
			for k := range keys {
				key := uniqueKey(fmt.Sprintf("three-%d", k))
				names[k] = key
				answers[k] = make([]answer, copies)
				for i := range copies {
					wg.Go(func() {
						c := newSDKClient(t, procs[(k+i)%3].base, 0)
						r, err := c.once(context.Background(), key, "sleep=300ms", `{"amount":1}`)
						answers[k][i] = answer{r, err}
					})
				}
			}
			wg.Wait()
			replays, conflicts := 0, 0
			for k := range keys {
				key, body, fresh := names[k], "", 0
				for _, a := range answers[k] {
					if a.err != nil {
						t.Fatalf("request: %v", a.err)
					}
					switch {
					case a.r.status == http.StatusConflict:
						conflicts++
					case a.r.status == http.StatusCreated && a.r.header.Get("Idempotent-Replayed") == "true":
						replays++
						if body != "" && a.r.body != body {
							t.Errorf("key %q: replay %s differs from %s", key, a.r.body, body)
						}
						body = a.r.body
					case a.r.status == http.StatusCreated:
						fresh++
						if body != "" && a.r.body != body {
							t.Errorf("key %q: answer %s differs from %s", key, a.r.body, body)
						}
						body = a.r.body
					default:
						t.Errorf("key %q: %d %s", key, a.r.status, a.r.body)
					}
				}
				if fresh != 1 {
					t.Errorf("key %q: %d first-execution answers, want 1", key, fresh)
				}
				// Once it has completed, every proxy replays it.
				for _, p := range procs {
					r, err := newSDKClient(t, p.base, 0).once(context.Background(), key, "sleep=300ms", `{"amount":1}`)
					if err != nil || r.status != http.StatusCreated || r.body != body || r.header.Get("Idempotent-Replayed") != "true" {
						t.Errorf("key %q after completion: %d %s %v, want the replay of %s", key, r.status, r.body, err, body)
					}
					replays++
				}
				wantExecutions(t, up, key, 1)
			}
			t.Logf("%s: %d keys × %d requests over 3 proxies: %d executions, %d replays, %d × 409",
				st.name, keys, copies, keys, replays, conflicts)
			for _, p := range procs {
				p.checkHealthyLog(t)
			}
		})
	}
}
