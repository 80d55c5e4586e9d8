package idemsqs

import (
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/schemas"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
)

// QueryProtocol is an sqs.Options function that makes the client speak
// SQS's older query protocol (form-encoded requests, XML answers) instead
// of AWS JSON 1.0: for local SQS-compatible servers that only speak that,
// such as goaws v0.4. Amazon SQS speaks both.
//
//	client := sqs.NewFromConfig(cfg, idemsqs.QueryProtocol)
func QueryProtocol(o *sqs.Options) { o.Protocol = awsquery.New(schemas.AmazonSQS) }
