package idemsqs

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// parseRedrivePolicy reads a queue's RedrivePolicy attribute, whose
// maxReceiveCount SQS writes as a number and some servers as a string.
func parseRedrivePolicy(s string) (maxReceiveCount int, deadLetterTargetARN string, err error) {
	var rp struct {
		DeadLetterTargetARN string          `json:"deadLetterTargetArn"`
		MaxReceiveCount     json.RawMessage `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(s), &rp); err != nil {
		return 0, "", fmt.Errorf("RedrivePolicy %q is not JSON: %w", s, err)
	}
	if len(rp.MaxReceiveCount) > 0 {
		n, err := strconv.Atoi(strings.Trim(string(rp.MaxReceiveCount), `"`))
		if err != nil || n < 0 {
			return 0, "", fmt.Errorf("RedrivePolicy %q: maxReceiveCount is not a count", s)
		}
		maxReceiveCount = n
	}
	return maxReceiveCount, rp.DeadLetterTargetARN, nil
}

// queueURLFromARN looks up the URL of the queue an ARN names
// (arn:aws:sqs:REGION:ACCOUNT:NAME), or a bare queue name, which is what
// goaws reports as a redrive policy's target.
func queueURLFromARN(ctx context.Context, client *sqs.Client, arn string) (string, error) {
	in := &sqs.GetQueueUrlInput{QueueName: aws.String(arn)}
	if strings.HasPrefix(arn, "arn:") {
		parts := strings.Split(arn, ":")
		if len(parts) != 6 || parts[2] != "sqs" || parts[5] == "" {
			return "", fmt.Errorf("idemsqs: %q is not an SQS queue ARN", arn)
		}
		in.QueueName = aws.String(parts[5])
		if parts[4] != "" {
			in.QueueOwnerAWSAccountId = aws.String(parts[4])
		}
	}
	out, err := client.GetQueueUrl(ctx, in)
	if err != nil {
		return "", fmt.Errorf("idemsqs: queue %s: %w", arn, err)
	}
	return aws.ToString(out.QueueUrl), nil
}
