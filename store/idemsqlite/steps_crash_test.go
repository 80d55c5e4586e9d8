package idemsqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// The worked example of idem.Steps: book a ride (a row in the store's
// database, transactional with its step), charge the card and send the
// receipt (foreign calls carrying the step's DownstreamKey), behind the
// idemhttp middleware, on SQLite. TestStepsRideCrash runs the server as a
// child process and SIGKILLs it at every point between and inside the
// steps; the card processor and the mailer run in the test process and
// count calls and effects by idempotency key.

// Environment of the ride server started by TestStepsRideCrash.
const (
	envRideServer = "IDEMSQLITE_RIDE_SERVER"
	envRideDB     = "IDEMSQLITE_RIDE_DB"
	envRideAddr   = "IDEMSQLITE_RIDE_ADDR"   // file the server writes its address to
	envRideCrash  = "IDEMSQLITE_RIDE_CRASH"  // the point at which it stops for the kill
	envRideMarker = "IDEMSQLITE_RIDE_MARKER" // file it writes when it reaches that point
	envRideCard   = "IDEMSQLITE_RIDE_CARD"   // the card processor's URL
	envRideMail   = "IDEMSQLITE_RIDE_MAIL"   // the mailer's URL
)

// ridePoints are the crash points in the order one booking reaches them.
var ridePoints = []string{
	"ride-tx",        // inside create-ride's transaction, before its commit
	"ride-done",      // create-ride recorded, charge not started
	"charge-called",  // the card was charged, the step not recorded yet
	"charge-done",    // charge recorded, receipt not started
	"receipt-called", // the receipt was sent, the step not recorded yet
	"receipt-done",   // every step recorded, the response not yet
}

const rideLease = time.Second

// TestStepsRideServer is the ride server the crash test kills. It does
// nothing in a normal run.
func TestStepsRideServer(t *testing.T) {
	if os.Getenv(envRideServer) != "1" {
		t.Skip("server process for TestStepsRideCrash")
	}
	fail := func(what string, err error) {
		fmt.Fprintln(os.Stderr, "ride server:", what+":", err)
		os.Exit(2)
	}
	s, err := Open(context.Background(), os.Getenv(envRideDB), nil)
	if err != nil {
		fail("open", err)
	}
	crashAt := os.Getenv(envRideCrash)
	crash := func(point string) {
		if point != crashAt {
			return
		}
		// Written whole, then renamed: the parent must never read it half-written.
		marker := os.Getenv(envRideMarker)
		if err := os.WriteFile(marker+".tmp", []byte(point), 0o600); err != nil {
			fail("marker", err)
		}
		if err := os.Rename(marker+".tmp", marker); err != nil {
			fail("marker", err)
		}
		<-make(chan struct{}) // until SIGKILL
	}
	m, err := idemhttp.New(s, &idemhttp.Config{
		Principal: func(*http.Request) (string, error) { return "rider-7", nil },
		Lease:     rideLease,
	})
	if err != nil {
		fail("middleware", err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /rides", m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		steps := idem.StepsFrom(ctx)
		ride, err := idem.DoTx(ctx, steps, "create-ride", func(ctx context.Context, tx *sql.Tx, st idem.Step) ([]byte, error) {
			var id int64
			if err := tx.QueryRowContext(ctx, "INSERT INTO rides (op) VALUES (?) RETURNING id", st.DownstreamKey).Scan(&id); err != nil {
				return nil, err
			}
			crash("ride-tx")
			return fmt.Appendf(nil, "ride_%d", id), nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // 5xx: the key is released, the steps stay
			return
		}
		crash("ride-done")
		charge, err := steps.Do(ctx, "charge", func(ctx context.Context, st idem.Step) ([]byte, error) {
			id, err := callForeign(ctx, os.Getenv(envRideCard), st.DownstreamKey)
			crash("charge-called")
			return id, err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		crash("charge-done")
		receipt, err := steps.Do(ctx, "receipt", func(ctx context.Context, st idem.Step) ([]byte, error) {
			id, err := callForeign(ctx, os.Getenv(envRideMail), st.DownstreamKey)
			crash("receipt-called")
			return id, err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		crash("receipt-done")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"ride": string(ride), "charge": string(charge), "receipt": string(receipt)})
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("listen", err)
	}
	addrFile := os.Getenv(envRideAddr)
	if err := os.WriteFile(addrFile+".tmp", []byte(ln.Addr().String()), 0o600); err != nil {
		fail("address", err)
	}
	if err := os.Rename(addrFile+".tmp", addrFile); err != nil {
		fail("address", err)
	}
	fail("serve", http.Serve(ln, mux))
}

// callForeign POSTs to a foreign service with the step's key and returns
// the id it answers.
func callForeign(ctx context.Context, url, key string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %d %s %v", url, resp.StatusCode, body, err)
	}
	return body, nil
}

// foreign is a fake external service that deduplicates by Idempotency-Key
// and counts calls and effects.
type foreign struct {
	prefix string
	mu     sync.Mutex
	calls  int
	ids    map[string]string
}

func (f *foreign) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if key == "" {
		http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
		return
	}
	id, ok := f.ids[key]
	if !ok {
		id = fmt.Sprintf("%s_%d", f.prefix, len(f.ids)+1)
		f.ids[key] = id
	}
	_, _ = io.WriteString(w, id)
}

func (f *foreign) counts() (calls, effects int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, len(f.ids)
}

// rideChild is one ride server process.
type rideChild struct {
	cmd    *exec.Cmd
	addr   string
	marker string
	stderr *strings.Builder
}

func startRideChild(t *testing.T, dir, dsn, crashAt string, card, mail *httptest.Server, n int) *rideChild {
	t.Helper()
	c := &rideChild{marker: filepath.Join(dir, fmt.Sprintf("crashed-%d", n)), stderr: &strings.Builder{}}
	addrFile := filepath.Join(dir, fmt.Sprintf("addr-%d", n))
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestStepsRideServer$", "-test.count=1")
	c.cmd.Env = append(os.Environ(), envRideServer+"=1", envRideDB+"="+dsn, envRideAddr+"="+addrFile,
		envRideCrash+"="+crashAt, envRideMarker+"="+c.marker, envRideCard+"="+card.URL, envRideMail+"="+mail.URL)
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(addrFile)
		if err == nil {
			c.addr = string(b)
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("ride server %d never listened; stderr:\n%s", n, c.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill SIGKILLs the child and checks that it died of it.
func (c *rideChild) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := c.cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("ride server did not die of SIGKILL: %v; stderr:\n%s", err, c.stderr.String())
	}
}

type rideResponse struct {
	status int
	body   string
	err    error
}

// book sends the booking with the client's one Idempotency-Key.
func book(client *http.Client, addr string) rideResponse {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/rides", strings.NewReader(`{"from":"Gare du Nord","to":"Orly"}`))
	req.Header.Set("Idempotency-Key", "book-ride-42")
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return rideResponse{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return rideResponse{status: resp.StatusCode, body: string(b), err: err}
}

// TestStepsRideCrash books one ride with one Idempotency-Key while the
// server is SIGKILLed at each point of ridePoints in turn (a new server
// process each time, the client retrying as a real one does): the ride
// row, the charge and the receipt each happen once, the foreign calls
// repeated after a crash between call and record carry the same key, and
// the final response is the one every later retry gets, also from a
// restarted server.
func TestStepsRideCrash(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	ctx := context.Background()
	dir := t.TempDir()
	dsn := "sqlite://" + filepath.Join(dir, "rides.db")
	s, err := Open(ctx, dsn, &Config{AutoMigrate: true, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.DB().Exec("CREATE TABLE rides (id INTEGER PRIMARY KEY, op TEXT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	cardSvc := &foreign{prefix: "ch", ids: map[string]string{}}
	mailSvc := &foreign{prefix: "msg", ids: map[string]string{}}
	card, mail := httptest.NewServer(cardSvc), httptest.NewServer(mailSvc)
	defer card.Close()
	defer mail.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 60 * time.Second}

	for i, point := range ridePoints {
		child := startRideChild(t, dir, dsn, point, card, mail, i)
		conflicts := 0
		for {
			done := make(chan rideResponse, 1)
			go func() { done <- book(client, child.addr) }()
			var res rideResponse
			crashed := false
			for waiting := true; waiting; {
				select {
				case res = <-done:
					waiting = false
				case <-time.After(20 * time.Millisecond):
					if b, err := os.ReadFile(child.marker); err == nil {
						if string(b) != point {
							t.Fatalf("server stopped at %q, want %q", b, point)
						}
						child.kill(t)
						res = <-done
						crashed, waiting = true, false
					}
				}
			}
			if crashed {
				if res.err == nil {
					t.Fatalf("killed at %s, the client still got %d %s", point, res.status, res.body)
				}
				break
			}
			if res.err != nil || res.status != http.StatusConflict {
				t.Fatalf("before the crash at %s: want 409 while the killed server's lease lives, got %d %q %v; stderr:\n%s",
					point, res.status, res.body, res.err, child.stderr.String())
			}
			conflicts++
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("killed at %-14s after %d retries answered 409", point, conflicts)
	}

	// A server that is not killed finishes the booking.
	child := startRideChild(t, dir, dsn, "", card, mail, len(ridePoints))
	var final rideResponse
	for {
		final = book(client, child.addr)
		if final.err == nil && final.status != http.StatusConflict {
			break
		}
		if final.err != nil {
			t.Fatal(final.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	want := `{"charge":"ch_1","receipt":"msg_1","ride":"ride_1"}` + "\n"
	if final.status != http.StatusCreated || final.body != want {
		t.Fatalf("final response: %d %q, want 201 %q", final.status, final.body, want)
	}

	// Dozens of retries at once, then a restarted server: the same response.
	var wg sync.WaitGroup
	replies := make([]rideResponse, 24)
	for i := range replies {
		wg.Add(1)
		go func() { defer wg.Done(); replies[i] = book(client, child.addr) }()
	}
	wg.Wait()
	child.kill(t)
	restarted := startRideChild(t, dir, dsn, "", card, mail, len(ridePoints)+1)
	replies = append(replies, book(client, restarted.addr))
	for i, r := range replies {
		if r.err != nil || r.status != final.status || r.body != final.body {
			t.Errorf("retry %d: %d %q %v, want the final response", i, r.status, r.body, r.err)
		}
	}

	var rides int
	if err := s.DB().QueryRow("SELECT count(*) FROM rides").Scan(&rides); err != nil {
		t.Fatal(err)
	}
	cardCalls, charges := cardSvc.counts()
	mailCalls, mails := mailSvc.counts()
	if rides != 1 || charges != 1 || mails != 1 {
		t.Errorf("effects: %d rides, %d charges, %d receipts; want exactly one each", rides, charges, mails)
	}
	// One call was cut by a kill between the call and its record, and
	// repeated with the same key by the next server.
	if cardCalls != 2 || mailCalls != 2 {
		t.Errorf("calls: %d to the card processor, %d to the mailer; want 2 each (one repeated after the kill between call and record)", cardCalls, mailCalls)
	}
	client.CloseIdleConnections()
	t.Logf("%d rides, %d charges in %d calls, %d receipts in %d calls; %d retries got the final response",
		rides, charges, cardCalls, mails, mailCalls, len(replies))
}
