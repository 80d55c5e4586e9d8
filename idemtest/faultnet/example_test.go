package faultnet_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-go/idem/idemtest/faultnet"
)

// The first attempt reaches the server but its client is cut before the
// response arrives, as when a connection dies in flight; the retry goes
// through. The server handled the request twice: exactly what an
// Idempotency-Key guard in front of it has to absorb.
func Example() {
	handled := make(chan struct{}, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		handled <- struct{}{}
		fmt.Fprint(w, "charged")
	}))
	defer srv.Close()

	relay, err := faultnet.Start(srv.Listener.Addr().String())
	if err != nil {
		panic(err)
	}
	defer relay.Close()
	relay.SetNext(1, faultnet.Fault{CutAfterRequest: 1})

	// A transport without keep-alives: each attempt opens a connection.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	charge := func() (string, error) {
		resp, err := client.Post(relay.URL()+"/charge", "text/plain", strings.NewReader("order 42"))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}

	_, err = charge()
	fmt.Println("first attempt failed:", err != nil)
	<-handled
	fmt.Println("the server handled it anyway")

	body, err := charge()
	fmt.Println("retry:", body, err)
	<-handled

	// Counters move just after what they count, so wait rather than peek.
	s, _ := relay.Wait(context.Background(), func(s faultnet.Stats) bool { return s.Cut == 1 })
	fmt.Println("connections:", s.Accepted, "cut:", s.Cut)
	// Output:
	// first attempt failed: true
	// the server handled it anyway
	// retry: charged <nil>
	// connections: 2 cut: 1
}
