package idemnats_test

import (
	"context"
	"log"
	"os"
	"time"

	"github.com/idem-go/idem/broker/idemnats"
	"github.com/idem-go/idem/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publish outbox events to JetStream: the relay hands batches to the
// publisher, which sends each with its event id as the Nats-Msg-Id and
// reports, per event, whether the stream acknowledged it.
func ExampleNewOutboxPublisher() {
	nc, err := nats.Connect(os.Getenv("IDEM_NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	// The client forgets an ack that never comes after 10s.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	pub, err := idemnats.NewOutboxPublisher(js, &idemnats.OutboxConfig{AckTimeout: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	// The relay (outbox.Relay) calls Publish; called directly here.
	errs := pub.Publish(context.Background(), []outbox.Message{
		{ID: "order-42-created", Topic: "orders.created", Payload: []byte(`{"order":42}`)},
	})
	for _, err := range errs {
		switch {
		case err == nil: // stored by the stream (or already stored: a duplicate)
		case outbox.Permanent(err): // no stream for the subject, too large: dead-lettered
			log.Print(err)
		default: // retried by the relay with backoff
			log.Print(err)
		}
	}
}
