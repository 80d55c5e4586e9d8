package idemsqs_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/idemsqlite"
)

// Consume an SQS queue with the SQLite store: each receive of up to ten
// messages is one transaction with their dedupe records, and the messages
// are deleted after the commit.
func ExampleNewConsumer() {
	ctx := context.Background()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client := sqs.NewFromConfig(awsCfg)
	store, err := idemsqlite.Open(ctx, "sqlite://idem.db", &idemsqlite.Config{AutoMigrate: true})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	insert := func(ctx context.Context, tx *sql.Tx, d consume.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (msg_id, body) VALUES (?, ?)`, d.ID(), d.Body())
		return err
	}
	c, err := idemsqs.NewConsumer(client, &idemsqs.Config{
		Config:             consume.Config{Name: "billing"},
		QueueURL:           "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
		DeadLetterQueueURL: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders-dlq",
		Process:            consume.Transactional(store, insert),
		BatchProcess: consume.TransactionalBatch(store, func(ctx context.Context, tx *sql.Tx, fresh []consume.Delivery) error {
			for _, d := range fresh {
				if err := insert(ctx, tx, d); err != nil {
					return err
				}
			}
			return nil
		}),
	})
	if err != nil {
		log.Fatal(err) // the configuration alone is wrong
	}
	if err := c.Ping(ctx); err != nil {
		log.Fatal(err) // e.g. the dedupe window is shorter than maxReceiveCount × visibility + backoff
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Publish with an id: on a FIFO queue SQS drops a retry of the same send
// within five minutes, and the consumer deduplicates by the id after that.
func ExamplePublish() {
	ctx := context.Background()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	res, err := idemsqs.Publish(ctx, sqs.NewFromConfig(awsCfg), "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo", idemsqs.Message{
		Body:    `{"order":42,"amount":100}`,
		ID:      "order-42",
		GroupID: "customer-7",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.ID, res.DeduplicationID)
}
