package idemamqp_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/idemamqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// BenchmarkConsumeToPostgres measures messages/s from RabbitMQ through idem
// into a PostgreSQL effect: one transaction per message against batched
// dedupe (one dedupe statement and one transaction per batch of 50).
func BenchmarkConsumeToPostgres(b *testing.B) {
	for _, mode := range []string{"per-message", "batch-50"} {
		b.Run(mode, func(b *testing.B) {
			pg := newPG(b)
			topo, conn := newTopology(b)
			ch, err := conn.Channel()
			if err != nil {
				b.Fatal(err)
			}
			defer ch.Close()
			if err := ch.Confirm(false); err != nil {
				b.Fatal(err)
			}
			var pending []*amqp.DeferredConfirmation
			for i := range b.N {
				dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", topo.Queue, false, false, amqp.Publishing{
					MessageId: fmt.Sprintf("bench-%d", i), DeliveryMode: amqp.Persistent, Body: body(fmt.Sprintf("acct-%d", i%1000), 1),
				})
				if err != nil {
					b.Fatal(err)
				}
				pending = append(pending, dc)
			}
			for _, dc := range pending {
				dc.WaitContext(context.Background())
			}
			mod := func(*idemamqp.Config) {}
			if mode != "per-message" {
				mod = batchConfig(pg)
			}
			c, counters := newConsumer(b, idemamqp.DialURL(amqpURL(b)), topo, pg.idemProcess(pg.creditHandler(nil)), func(cfg *idemamqp.Config) {
				cfg.Concurrency = 8
				mod(cfg)
			})
			b.ResetTimer()
			start := time.Now()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			for counters.Snapshot().Processed < int64(b.N) {
				time.Sleep(2 * time.Millisecond)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			b.StopTimer()
			cancel()
			<-done
		})
	}
}
