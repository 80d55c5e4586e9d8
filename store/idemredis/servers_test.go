package idemredis_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startRedis starts a private, non-persistent redis-server on a random
// loopback port, so tests can change its configuration without touching
// the shared server. It is killed when t ends.
func startRedis(t testing.TB, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skipf("redis-server is not installed: %v", err)
	}
	var lastErr error
	for range 3 {
		port := freePort(t)
		all := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir(), "--logfile", ""}, args...)
		cmd := exec.Command("redis-server", all...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if lastErr = waitPing(addr, 5*time.Second); lastErr == nil {
			return addr
		}
		_ = cmd.Process.Kill()
	}
	t.Fatalf("redis-server did not answer: %v", lastErr)
	return ""
}

// waitPing waits until a server answers PING on addr.
func waitPing(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(time.Second))
			_, err = conn.Write([]byte("PING\r\n"))
			buf := make([]byte, 7)
			if err == nil {
				_, err = conn.Read(buf)
			}
			conn.Close()
			if err == nil && string(buf) == "+PONG\r\n" {
				return nil
			}
			if err == nil {
				err = fmt.Errorf("PING answered %q", buf)
			}
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clientAt opens a client on addrs, closed when t ends.
func clientAt(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs})
	if err != nil {
		t.Fatalf("connect to %v: %v", addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

// do runs one command and fails the test on an error.
func do(t testing.TB, c rueidis.Client, cmd rueidis.Completed) {
	t.Helper()
	if err := c.Do(context.Background(), cmd).Error(); err != nil {
		t.Fatal(err)
	}
}
