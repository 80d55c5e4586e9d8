// Package outbox is the producer side of exactly-once effects: an event
// written inside the producer's own database transaction is published to
// the broker if and only if that transaction commits (the transactional
// outbox).
//
// # Writing
//
// Each SQL store has an outbox that writes in the caller's transaction,
// a [Writer] over the store's transaction type:
//
//	ob := pgStore.Outbox() // idempgx: Writer[pgx.Tx]
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO orders …"); err != nil {
//			return err
//		}
//		return ob.Write(ctx, tx, outbox.Event{Topic: "orders.created", Key: orderID, ID: "order-created-" + orderID, Payload: body})
//	})
//
// Every event is validated ([Event] documents the limits) before the
// transaction is touched; several events go in one INSERT. A rolled-back
// transaction leaves nothing behind.
//
// # Relaying
//
// A [Relay] claims due events in batches (FOR UPDATE SKIP LOCKED on
// PostgreSQL, MySQL 8 and MariaDB 10.6; SQLite's single writer), hands
// each batch to a [Publisher] (idemamqp, idemnats, idemkafka, idemsqs) and
// marks an event sent only once the broker confirmed it. Failures are
// retried with full jitter (package retry); an event that fails
// MaxAttempts times, or with a [PermanentError], goes to the dead state
// with its attempts, last error (root cause first) and timestamps, and
// stays there until an operator redrives or discards it (`idem outbox
// dead|show|redrive|discard`). Every claim is fenced by a token and
// leased: a relay that crashes mid-batch loses nothing, its batch is taken
// over when the lease ends.
//
// # Guarantees
//
// Published at least once, with a stable id: a relay that crashes after
// the broker confirmed and before it marked the event sent publishes it
// again, under the same [Message].ID, which the broker's dedupe (NATS
// Nats-Msg-Id, SQS FIFO, Kafka's idempotent producer within a session)
// and idem's consumers remove. With Config.Ordered, events that share a
// Key are published one at a time, in write order.
package outbox
