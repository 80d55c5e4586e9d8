package idemredis_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/storetest"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/redis/rueidis"
)

// startCluster starts a three-master Redis Cluster on loopback ports and
// returns the node addresses.
func startCluster(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skipf("redis-cli is not installed: %v", err)
	}
	var addrs []string
	for i := range 3 {
		addrs = append(addrs, startRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i), "--cluster-node-timeout", "5000"))
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	// Every node must agree the cluster is up before clients use it.
	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range addrs {
		host, port, _ := strings.Cut(addr, ":")
		for {
			out, err := exec.Command("redis-cli", "-h", host, "-p", port, "cluster", "info").Output()
			if err == nil && strings.Contains(string(out), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s is not ok: %v\n%s", addr, err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return addrs
}

// TestCluster claims thousands of keys spread over the slots of a real
// three-node cluster and runs the conformance suite on it. It needs
// IDEM_REDIS_CLUSTER_TEST=1 (it starts three redis-servers).
func TestCluster(t *testing.T) {
	if os.Getenv("IDEM_REDIS_CLUSTER_TEST") == "" {
		t.Skip("set IDEM_REDIS_CLUSTER_TEST=1 to start a 3-node Redis Cluster on loopback ports")
	}
	addrs := startCluster(t)
	c := clientAt(t, addrs...)
	if c.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %v, want cluster", c.Mode())
	}

	t.Run("ThousandsOfKeys", func(t *testing.T) {
		s := newStore(t, c, &idemConfigStrict)
		ctx := context.Background()
		const keys, workers = 3000, 64
		jobs := make(chan int)
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := range jobs {
					if err := claimCycle(ctx, s, i); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		for i := range keys {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// The records spread over all three masters.
		for addr, node := range c.Nodes() {
			n, err := node.Do(ctx, node.B().Dbsize().Build()).AsInt64()
			if err != nil {
				t.Fatalf("DBSIZE on %s: %v", addr, err)
			}
			if n < keys/6 {
				t.Errorf("node %s holds %d of %d records; the hash tags do not spread them", addr, n, keys)
			}
			t.Logf("node %s: %d keys", addr, n)
		}
	})

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idem.Store { return newStore(t, c, nil) },
			&storetest.Options{ClockPrecision: time.Millisecond, ExpiresByTTL: true})
		storetest.RunList(t, func(t *testing.T) idem.Store { return newStore(t, c, nil) },
			&storetest.ListOptions{Unordered: true})
		storetest.RunSteps(t, func(t *testing.T) idem.Store { return newStore(t, c, nil) },
			&storetest.Options{ClockPrecision: time.Millisecond, ExpiresByTTL: true})
	})
}

// claimCycle claims key i, completes it, checks the replay, and for every
// tenth key deletes and claims again to exercise the token floor.
func claimCycle(ctx context.Context, s idem.Store, i int) error {
	key := "key-" + strconv.Itoa(i)
	req := idem.ClaimRequest{Scope: "cluster", Key: key, Fingerprint: idem.FingerprintBytes([]byte(key)), Lease: time.Minute}
	cl, err := s.Claim(ctx, req)
	if err != nil || cl.Outcome != idem.Acquired {
		return fmt.Errorf("claim %s: %v %v", key, cl.Outcome, err)
	}
	if err := s.Complete(ctx, idem.CompleteRequest{Scope: "cluster", Key: key, Token: cl.Token, Result: []byte(key), Retention: time.Hour}); err != nil {
		return fmt.Errorf("complete %s: %w", key, err)
	}
	again, err := s.Claim(ctx, req)
	if err != nil || again.Outcome != idem.Completed || string(again.Record.Result) != key {
		return fmt.Errorf("replay %s: %v %v", key, again.Outcome, err)
	}
	if i%10 == 0 {
		if err := s.Delete(ctx, "cluster", key); err != nil {
			return fmt.Errorf("delete %s: %w", key, err)
		}
		next, err := s.Claim(ctx, req)
		if err != nil || next.Outcome != idem.Acquired || next.Token <= cl.Token {
			return fmt.Errorf("claim after delete %s: %+v %v", key, next, err)
		}
	}
	return nil
}

// idemConfigStrict makes New refuse a cluster node with an evicting policy.
var idemConfigStrict = idemredis.Config{Strict: true}
