package idemsqs_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemtest"
)

// loseDeletes is a transport that spoils the receipt handle of the first
// entry of the first n DeleteMessageBatch calls, as if SQS had failed that
// entry: the message stays in flight.
type loseDeletes struct {
	n    atomic.Int32
	lost atomic.Int32
}

func (l *loseDeletes) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil && l.n.Load() > 0 {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		form, err := url.ParseQuery(string(body))
		if err == nil && form.Get("Action") == "DeleteMessageBatch" && l.n.Add(-1) >= 0 {
			form.Set("DeleteMessageBatchRequestEntry.1.ReceiptHandle", "lost")
			l.lost.Add(1)
			body = []byte(form.Encode())
			r.ContentLength = int64(len(body))
			r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// A processed message whose delete failed comes back after its visibility
// timeout and is deduped: every effect still happens once.
func TestFailedDeleteIsDeduped(t *testing.T) {
	t.Parallel()
	endpoint := idemtest.ServiceURL(t, "IDEM_SQS_URL")
	plain := newClient(endpoint)
	q := newQueue(t, plain, t.Name(), map[string]string{"VisibilityTimeout": "1"})
	dlq := newQueue(t, plain, t.Name()+"-dlq", nil)
	lose := &loseDeletes{}
	lose.n.Store(2)
	lossy := sqs.New(sqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("idem", "idem", ""),
		HTTPClient:  &http.Client{Transport: lose},
	}, idemsqs.QueryProtocol)
	l := newLedger(t)
	const n = 10
	for i := range n {
		publish(t, plain, q, idemsqs.Message{Body: fmt.Sprintf("event-%d", i)})
	}
	var counters consume.Counters
	runConsumer(t, newConsumer(t, lossy, q, dlq, l.process(), func(cfg *idemsqs.Config) {
		cfg.BatchProcess = l.batch()
		cfg.Concurrency = 1
		cfg.Hooks = []idem.Hook{&counters}
	}))
	waitFor(t, 30*time.Second, "every message deleted", func() bool { return queueDepth(t, plain, q) == 0 })
	if lose.lost.Load() == 0 {
		t.Fatal("no delete was spoiled")
	}
	got := l.counts(t)
	if len(got) != n {
		t.Fatalf("%d events applied, want %d", len(got), n)
	}
	for id, k := range got {
		if k != 1 {
			t.Errorf("%s applied %d times", id, k)
		}
	}
	// At least the lost deletes come back as duplicates (a loaded machine
	// may let a one-second visibility lapse and redeliver more).
	if s := counters.Snapshot(); s.Processed != n || s.Duplicate < int64(lose.lost.Load()) {
		t.Errorf("counters %+v, want %d processed and at least %d duplicates (the lost deletes)", s, n, lose.lost.Load())
	}
}
