package idemsqs_test

import (
	"context"
	"log"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/outbox"
)

// Publish outbox events to an SQS FIFO queue: the event's Key is the
// MessageGroupId, its ID the MessageDeduplicationId and the idem-id
// attribute; up to ten events go out per SendMessageBatch.
func ExampleNewOutboxPublisher() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := idemsqs.NewOutboxPublisher(sqs.NewFromConfig(cfg), nil)
	if err != nil {
		log.Fatal(err)
	}
	// The relay (outbox.Relay) calls Publish; called directly here.
	queue := "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo" // Topic is the queue URL
	errs := pub.Publish(ctx, []outbox.Message{
		{ID: "order-42-created", Topic: queue, Key: "order-42", Payload: []byte(`{"status":"created"}`)},
		{ID: "order-42-paid", Topic: queue, Key: "order-42", Payload: []byte(`{"status":"paid"}`)},
	})
	for _, err := range errs {
		if err != nil {
			log.Print(err) // outbox.Permanent(err): dead-lettered; otherwise retried
		}
	}
}
