package idemsqs_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/store/idemsqlite"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newClient returns a client for the local SQS-compatible server at url
// (goaws speaks the query protocol).
func newClient(url string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider("idem", "idem", ""),
	}, idemsqs.QueryProtocol)
}

func sqsClient(t testing.TB) *sqs.Client {
	return newClient(idemtest.ServiceURL(t, "IDEM_SQS_URL"))
}

func suffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newQueue creates a uniquely named queue with attrs and deletes it at
// cleanup; a name ending in ".fifo" makes a FIFO queue.
func newQueue(t testing.TB, c *sqs.Client, name string, attrs map[string]string) string {
	t.Helper()
	fifo := strings.HasSuffix(name, ".fifo")
	name = strings.TrimSuffix(name, ".fifo")
	name = "idemtest-" + strings.NewReplacer("/", "-", "_", "-").Replace(name) + "-" + suffix()
	if len(name) > 70 {
		name = name[len(name)-70:]
	}
	if fifo {
		name += ".fifo"
		if attrs == nil {
			attrs = map[string]string{}
		}
		attrs["FifoQueue"] = "true"
	}
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatal(err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url
}

// queueDepth is the number of messages in the queue, visible or not: what
// goaws reports as ApproximateNumberOfMessages (it counts the hidden ones
// there, and again in ApproximateNumberOfMessagesNotVisible; SQS counts
// only the visible ones there).
func queueDepth(t testing.TB, c *sqs.Client, url string) int {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages},
	})
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(out.Attributes["ApproximateNumberOfMessages"])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// ledger is an SQLite store with a table the handlers credit: the
// non-idempotent effect.
type ledger struct {
	store *idemsqlite.Store
	db    *sql.DB
}

func newLedger(t testing.TB) *ledger {
	t.Helper()
	dsn := filepath.Join(t.TempDir(), "idem.db")
	st, err := idemsqlite.Open(context.Background(), dsn, &idemsqlite.Config{AutoMigrate: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	db, err := idemsqlite.OpenDB(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TABLE effects (id TEXT PRIMARY KEY, applied INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &ledger{store: st, db: db}
}

func (l *ledger) apply(ctx context.Context, tx *sql.Tx, id string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (id, applied) VALUES (?, 1) ON CONFLICT (id) DO UPDATE SET applied = applied + 1`, id)
	return err
}

// counts returns every id's number of applications.
func (l *ledger) counts(t testing.TB) map[string]int {
	t.Helper()
	rows, err := l.db.Query(`SELECT id, applied FROM effects`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

// process is the transactional ProcessFunc crediting the message's body.
func (l *ledger) process() consume.ProcessFunc {
	return consume.Transactional(l.store, func(ctx context.Context, tx *sql.Tx, d consume.Delivery) error {
		return l.apply(ctx, tx, string(d.Body()))
	})
}

func (l *ledger) batch() consume.BatchProcessFunc {
	return consume.TransactionalBatch(l.store, func(ctx context.Context, tx *sql.Tx, fresh []consume.Delivery) error {
		for _, d := range fresh {
			if err := l.apply(ctx, tx, string(d.Body())); err != nil {
				return err
			}
		}
		return nil
	})
}

// fastRetry retries after about a second (SQS visibility is in seconds).
func fastRetry(attempts int) *retry.Policy {
	return &retry.Policy{Base: time.Second, Cap: time.Second, MaxAttempts: attempts}
}

// newConsumer returns a consumer of queue with quick settings, changed by
// opts.
func newConsumer(t testing.TB, c *sqs.Client, queue, dlq string, process consume.ProcessFunc, opts ...func(*idemsqs.Config)) *idemsqs.Consumer {
	t.Helper()
	cfg := &idemsqs.Config{
		Config:             consume.Config{Name: "test", Retry: fastRetry(3), Logger: quiet},
		QueueURL:           queue,
		DeadLetterQueueURL: dlq,
		Process:            process,
		WaitTime:           time.Second,
	}
	for _, o := range opts {
		o(cfg)
	}
	cons, err := idemsqs.NewConsumer(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// runConsumer runs c until the test ends.
func runConsumer(t testing.TB, c *idemsqs.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func publish(t testing.TB, c *sqs.Client, queue string, m idemsqs.Message) idemsqs.PublishResult {
	t.Helper()
	res, err := idemsqs.Publish(context.Background(), c, queue, m)
	if err != nil {
		t.Fatal(err)
	}
	return res
}
