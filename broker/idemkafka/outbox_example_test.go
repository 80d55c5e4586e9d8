package idemkafka_test

import (
	"context"
	"fmt"
	"log"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/outbox"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Publish outbox events to Kafka: the record key is the event's Key (one
// partition, in order, per key) and the "idem-id" header its ID, which an
// idemkafka Consumer dedupes on.
func ExampleNewOutboxPublisher() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(3, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	// The idempotent producer is franz-go's default; a missing topic fails
	// after one metadata retry.
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.UnknownTopicRetries(1))
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()
	pub, err := idemkafka.NewOutboxPublisher(cl, nil)
	if err != nil {
		log.Fatal(err)
	}

	// The relay (outbox.Relay) calls Publish; called directly here.
	errs := pub.Publish(ctx, []outbox.Message{
		{ID: "order-42-created", Topic: "orders", Key: "order-42", Payload: []byte(`{"status":"created"}`)},
		{ID: "order-42-paid", Topic: "orders", Key: "order-42", Payload: []byte(`{"status":"paid"}`)},
		{ID: "order-43-created", Topic: "nope", Key: "order-43", Payload: []byte(`{"status":"created"}`)},
	})
	for _, err := range errs {
		fmt.Println(err == nil, outbox.Permanent(err))
	}

	reader, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"))
	defer reader.Close()
	fs := reader.PollRecords(ctx, 2)
	fs.EachRecord(func(r *kgo.Record) {
		fmt.Printf("key=%s idem-id=%s %s\n", r.Key, r.Headers[0].Value, r.Value)
	})
	// Output:
	// true false
	// true false
	// false true
	// key=order-42 idem-id=order-42-created {"status":"created"}
	// key=order-42 idem-id=order-42-paid {"status":"paid"}
}
