package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/idemtest"
)

// sqsEnv is a work queue and its dead-letter queue on the local
// SQS-compatible server (IDEM_SQS_URL, goaws), deleted at cleanup.
type sqsEnv struct {
	endpoint, queue, dlq string
	c                    *sqs.Client
}

func newSQSEnv(t *testing.T) *sqsEnv {
	t.Helper()
	e := &sqsEnv{endpoint: idemtest.ServiceURL(t, "IDEM_SQS_URL")}
	e.c = sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(e.endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("idem", "idem", "")}, idemsqs.QueryProtocol)
	name := "idemtest-cli-" + randomSuffix()
	for _, q := range []*string{&e.queue, &e.dlq} {
		out, err := e.c.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: aws.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		*q = aws.ToString(out.QueueUrl)
		t.Cleanup(func() { e.c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(*q)}) })
		name += "-dlq"
	}
	return e
}

// run runs "idem dlq sqs ARGS --endpoint URL --query-protocol --queue DLQ".
func (e *sqsEnv) run(t *testing.T, args ...string) cliResult {
	t.Helper()
	return runCLI(t, nil, append(append([]string{"dlq", "sqs"}, args...), "--endpoint", e.endpoint, "--query-protocol", "--queue", e.dlq)...)
}

// runSeeing is run, tried again for up to 45 s while its output lacks
// want. goaws (v0.4.5) can keep a queue's messages from every receive for
// a while after a scan released them (with ChangeMessageVisibility 0): on
// a loaded machine a command then finds nothing, which is harmless (a
// redrive that finds nothing moves nothing), and real SQS makes a
// released message visible at once. Each empty try is logged.
func (e *sqsEnv) runSeeing(t *testing.T, want string, args ...string) cliResult {
	t.Helper()
	for deadline := time.Now().Add(45 * time.Second); ; {
		r := e.run(t, args...)
		if strings.Contains(r.Stdout, want) || time.Now().After(deadline) {
			return r
		}
		t.Logf("%s: %q not seen yet (goaws): %s%s", strings.Join(args, " "), want, r.Stdout, r.Stderr)
		time.Sleep(time.Second)
	}
}

// deadLetter sends a dead letter as an idemsqs consumer writes it.
func (e *sqsEnv) deadLetter(t *testing.T, id string) {
	t.Helper()
	a := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	_, err := e.c.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(e.dlq), MessageBody: aws.String("body of " + id),
		MessageAttributes: map[string]types.MessageAttributeValue{
			idemsqs.AttrID: a(id), "x-idem-reason": a("max_attempts"), "x-idem-attempts": a("5"), "x-idem-consumer": a("orders"),
			"x-idem-last-error": a("boom: card declined"), "x-idem-origin": a(e.queue), idemsqs.AttrOriginalID: a("sqs-" + id),
		}})
	if err != nil {
		t.Fatal(err)
	}
}

// depth is the number of messages in queue q, visible or not (goaws
// counts them all in ApproximateNumberOfMessages).
func (e *sqsEnv) depth(t *testing.T, q string) int {
	t.Helper()
	out, err := e.c.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(out.Attributes["ApproximateNumberOfMessages"])
	return n
}

func TestDLQSQS(t *testing.T) {
	e := newSQSEnv(t)
	r := e.run(t, "list", "--fail-if-any")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "no dead letters in "+e.dlq) {
		t.Errorf("empty list: %s", r.Stdout)
	}
	e.deadLetter(t, "order-1")
	e.deadLetter(t, "order-2")
	r = e.runSeeing(t, "2 dead letter(s)", "list", "--fail-if-any")
	wantExit(t, r, exitDeadLetters, "2 dead letter(s)")
	for _, w := range []string{"order-1", "order-2", "max_attempts", "orders", "boom: card declined", "2 dead letter(s) in"} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("list lacks %q:\n%s", w, r.Stdout)
		}
	}
	r = e.runSeeing(t, "body of order-1", "show", "order-1")
	wantExit(t, r, exitOK)
	for _, w := range []string{`message "order-1" (SQS id sqs-order-1): max_attempts after 5 attempt(s) in consumer "orders"`, "origin: " + e.queue, "x-idem-last-error: boom: card declined", "body of order-1"} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("show lacks %q:\n%s", w, r.Stdout)
		}
	}
	wantExit(t, e.run(t, "show", "nope"), exitFailure, `message "nope" not found`)

	r = e.runSeeing(t, "would redrive order-1", "redrive", "--dry-run", "order-1")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "would redrive order-1") || e.depth(t, e.queue) != 0 {
		t.Errorf("dry run: %s", r.Stdout)
	}
	r = e.runSeeing(t, "redriven order-1", "redrive", "order-1", "order-9")
	wantExit(t, r, exitFailure, `not found in `, `"order-9"`)
	if !strings.Contains(r.Stdout, "redriven order-1") || e.depth(t, e.queue) != 1 || e.depth(t, e.dlq) != 1 {
		t.Errorf("redrive: %s (work queue %d, dead letters %d)", r.Stdout, e.depth(t, e.queue), e.depth(t, e.dlq))
	}
	redriven, err := e.c.ReceiveMessage(t.Context(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(e.queue), MessageAttributeNames: []string{"All"}})
	if err != nil || len(redriven.Messages) != 1 {
		t.Fatalf("receive the redriven message: %v", err)
	}
	got := redriven.Messages[0].MessageAttributes
	if aws.ToString(got[idemsqs.AttrID].StringValue) != "order-1" || aws.ToString(got[idemsqs.AttrRedrives].StringValue) != "1" || got["x-idem-reason"].StringValue != nil {
		t.Errorf("redriven attributes %v", got)
	}

	// goaws has no message move tasks: --move-task falls back.
	e.deadLetter(t, "order-3")
	r = e.runSeeing(t, "redriven order-3", "redrive", "--all", "--move-task", "--max-redrives", "9")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "redriven order-3") || !strings.Contains(r.Stdout, "no SQS message move task") {
		t.Errorf("redrive --move-task on goaws: %s", r.Stdout)
	}
	wantExit(t, e.run(t, "redrive", "--reason", "max_receive_count", "--move-task"), exitUsage, "--move-task moves every message")
	e.deadLetter(t, "order-4")

	wantExit(t, e.run(t, "purge"), exitUsage, "add --yes")
	r = e.run(t, "purge", "--yes")
	wantExit(t, r, exitOK)
	if e.depth(t, e.dlq) != 0 {
		t.Errorf("purge left %d dead letters", e.depth(t, e.dlq))
	}
}

func TestDLQSQSUsage(t *testing.T) {
	wantExit(t, runCLI(t, nil, "dlq", "sqs", "list"), exitUsage, "missing --queue URL")
	wantExit(t, runCLI(t, nil, "dlq", "sqs", "list", "--queue", "orders-dlq"), exitUsage, "not a queue URL")
	wantExit(t, runCLI(t, nil, "dlq", "sqs", "redrive", "--queue", "http://h/1/q"), exitUsage, "choose what to redrive")
	wantExit(t, runCLI(t, nil, "dlq", "sqs", "list", "--queue", "http://127.0.0.1:1/1/q", "--endpoint", "http://127.0.0.1:1", "--query-protocol"), exitFailure, "cannot read queue")
}
