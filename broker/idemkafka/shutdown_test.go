package idemkafka_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// hangable makes the cluster's answers to keys hang, once hang is set,
// until the test ends; when only is not nil it decides which requests.
func hangable(t *testing.T, e *env, hang *atomic.Bool, only func(kmsg.Request) bool, keys ...kmsg.Key) {
	t.Helper()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the cluster closes
	for _, key := range keys {
		e.cluster.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			e.cluster.KeepControl()
			if hang.Load() && (only == nil || only(req)) {
				e.cluster.SleepControl(func() { <-release })
			}
			return nil, nil, false
		})
	}
}

// closedHook is a franz-go hook that reports its client's close.
type closedHook struct {
	once   sync.Once
	closed chan struct{}
}

func (h *closedHook) OnClientClosed(*kgo.Client) { h.once.Do(func() { close(h.closed) }) }

// awaitClose returns a client option for one consumer; t's cleanup then
// waits until that consumer's client has closed. Call it after newEnv and
// before hangable, so that the wait comes after the hangs are released and
// before the cluster closes. Shutdown leaves the close to finish in the
// background once its bound passes, and the released hang lets it finish;
// were the cluster to close first, franz-go would retry the hung join
// against it, on the client's own context, until its retry timeout, and
// the package's leak check could find those goroutines still running.
func awaitClose(t *testing.T) kgo.Opt {
	t.Helper()
	h := &closedHook{closed: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-h.closed:
		case <-time.After(time.Minute):
			t.Error("the consumer's client did not close after the hangs were released")
		}
	})
	return kgo.WithHooks(h)
}

// start runs c until the returned cancel, which waits for Run and returns
// how long it took after the cancel.
func start(t *testing.T, c *idemkafka.Consumer) (stop func() time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() time.Duration {
		t.Helper()
		begin := time.Now()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
		return time.Since(begin)
	}
}

const shutdownBound = time.Second

// checkBound fails when Run took longer than the bound, with a generous
// margin for a loaded machine: without the bound Run waits until the test
// ends.
func checkBound(t *testing.T, took time.Duration) {
	t.Helper()
	if took > shutdownBound+3*time.Second {
		t.Fatalf("Run took %v after its context ended, bound %v", took, shutdownBound)
	}
}

// Run returns within Config.ShutdownTimeout after its context ends even
// when the group coordinator stops answering (offset commits, heartbeats,
// joins and the leave all hang): it does not wait for franz-go's unbounded
// leave.
func TestShutdownBoundedWhenGroupHangs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	closeOpt := awaitClose(t)
	var hang, committed atomic.Bool
	// The first record's offset commit must pass before the coordinator
	// hangs: a commit caught by the hang would hold the consumer before it
	// fetches the second record, which the test then waits for in vain.
	e.cluster.ControlKey(int16(kmsg.OffsetCommit), func(kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if !hang.Load() {
			committed.Store(true)
		}
		return nil, nil, false
	})
	hangable(t, e, &hang, nil, kmsg.OffsetCommit, kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup, kmsg.ConsumerGroupHeartbeat)
	e.produce(t, e.client(t), idemkafka.NewRecord(e.topic, []byte("ok-1"), "ok-1"))
	stop := start(t, e.consumer(t, idemkafka.Config{BatchProcess: e.process(nil), ShutdownTimeout: shutdownBound,
		ClientOpts: []kgo.Opt{closeOpt}}))
	eventually(t, 10*time.Second, "the record processed", func() bool { return e.effects(t)["ok-1"] == 1 })
	eventually(t, 20*time.Second, "the record's offset committed", committed.Load)
	hang.Store(true)
	e.produce(t, e.client(t), idemkafka.NewRecord(e.topic, []byte("ok-2"), "ok-2"))
	eventually(t, 10*time.Second, "the second record processed", func() bool { return e.effects(t)["ok-2"] == 1 })
	checkBound(t, stop())
}

// The case the issue saw: a second member joins, the first one's rejoin
// never completes, and it is told to stop meanwhile. Run still returns
// within the bound, and the records it processed stay processed once.
func TestShutdownBoundedInHungRejoin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	closeA, closeB := awaitClose(t), awaitClose(t)
	var (
		hang, stuck atomic.Bool
		first       atomic.Value // the first member's id
	)
	hangable(t, e, &hang, func(req kmsg.Request) bool {
		id, _ := first.Load().(string)
		if req.(*kmsg.JoinGroupRequest).MemberID != id {
			return false
		}
		stuck.Store(true)
		return true
	}, kmsg.JoinGroup)
	e.cluster.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if id := req.(*kmsg.JoinGroupRequest).MemberID; id != "" {
			first.CompareAndSwap(nil, id)
		}
		return nil, nil, false
	})
	prod := e.client(t)
	e.produce(t, prod, idemkafka.NewRecord(e.topic, []byte("ok-1"), "ok-1"))
	stopA := start(t, e.consumer(t, idemkafka.Config{BatchProcess: e.process(nil), ShutdownTimeout: shutdownBound,
		ClientOpts: []kgo.Opt{closeA}}))
	eventually(t, 10*time.Second, "the record processed", func() bool { return e.effects(t)["ok-1"] == 1 })
	hang.Store(true)
	stopB := start(t, e.consumer(t, idemkafka.Config{BatchProcess: e.process(nil), ShutdownTimeout: shutdownBound,
		ClientOpts: []kgo.Opt{closeB}}))
	eventually(t, 20*time.Second, "the first member's rejoin hanging", stuck.Load)
	checkBound(t, stopA())
	checkBound(t, stopB())
	if got := e.effects(t); len(got) != 1 || got["ok-1"] != 1 {
		t.Fatalf("effects %v", got)
	}
}
