package idemsqs_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/idem-go/idem/broker/idemsqs"
)

// fakeMoveTasks answers the two calls of MoveBack in the AWS JSON 1.0
// protocol, as the SQS API reference describes them, and records the
// source ARN of the move task.
func fakeMoveTasks(t *testing.T, source *string) *sqs.Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in map[string]any
		json.NewDecoder(r.Body).Decode(&in)
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		switch r.Header.Get("X-Amz-Target") {
		case "AmazonSQS.GetQueueAttributes":
			json.NewEncoder(w).Encode(map[string]any{"Attributes": map[string]string{"QueueArn": "arn:aws:sqs:us-east-1:123456789012:orders-dlq"}})
		case "AmazonSQS.StartMessageMoveTask":
			*source, _ = in["SourceArn"].(string)
			json.NewEncoder(w).Encode(map[string]string{"TaskHandle": "task-1"})
		default:
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"__type": "com.amazonaws.sqs#UnsupportedOperation", "message": "no"})
		}
	}))
	t.Cleanup(srv.Close)
	return sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("idem", "idem", "")})
}

func TestMoveBack(t *testing.T) {
	var source string
	c := fakeMoveTasks(t, &source)
	handle, err := idemsqs.MoveBack(context.Background(), c, "https://sqs.us-east-1.amazonaws.com/123456789012/orders-dlq")
	if err != nil || handle != "task-1" || source != "arn:aws:sqs:us-east-1:123456789012:orders-dlq" {
		t.Fatalf("MoveBack = %q, %v (source %q)", handle, err, source)
	}
}

// goaws has no message move tasks: MoveBack says so, and Redrive is the way.
func TestMoveBackUnsupported(t *testing.T) {
	t.Parallel()
	c := sqsClient(t)
	dlq := newQueue(t, c, t.Name(), nil)
	if _, err := idemsqs.MoveBack(context.Background(), c, dlq); err == nil || !strings.Contains(err.Error(), "start message move task") {
		t.Fatalf("MoveBack on goaws = %v, want the move task's error", err)
	}
}
