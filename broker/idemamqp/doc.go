// Package idemamqp consumes RabbitMQ queues (amqp091-go) through idem's
// shared consumer engine: at-least-once deliveries in, exactly one effect
// out, and failures that end in a dead-letter queue a person can read and
// redrive.
//
// # Topology
//
// [Declare] creates, for a work queue Q: a retry queue (Q.retry) whose
// messages carry a per-message TTL and dead-letter back to Q when it
// expires; a dead-letter exchange (Q.dlx) set as Q's x-dead-letter-exchange;
// and a dead-letter queue (Q.dlq) bound to it. The retry queue is the delay
// mechanism: it neither busy-loops nor blocks the work queue's channel.
// RabbitMQ expires per-message TTLs only at the head of a queue, so a retry
// may wait longer than its delay behind a longer one, never shorter.
//
// # Consuming
//
// A [Consumer] runs the engine over manual acks with a bounded prefetch and
// a fixed number of handler goroutines. Each delivery goes through the
// user's idempotent [consume.ProcessFunc] (a SQL store's Process through
// consume.Transactional, or consume.GuardProcess) and is acked only after
// the commit; a duplicate is acked and counted. A failed delivery is
// republished to the retry queue with its attempt count in the
// x-idem-attempts header and the original acked once the broker confirms
// the copy; after MaxAttempts it is published to the dead-letter exchange
// with the failure headers (consume.Header*) and RabbitMQ's x-death
// entries preserved. When the connection or channel is lost the consumer
// reconnects with backoff; the broker redelivers what was unacked and idem
// deduplicates it. [NewConsumer] does no I/O; [Consumer.Ping] dials and
// checks that the topology exists.
//
// # Dead letters
//
// [ListDeadLetters] reads a dead-letter queue without consuming it, with
// each message's failure context; [Redrive] moves chosen messages back to
// their original exchange and routing key. Redrive is manual only: nothing
// in this package calls it.
//
// A dead letter carries the original message id (its MessageId and
// consume.HeaderOriginalID) and a dead-letter id (consume.HeaderDeadLetterID,
// [DeadLetterID]) derived from the work queue, the message id and the
// content. RabbitMQ has no dedupe on publish: a message whose ack was lost
// after its dead letter was published is redelivered and dead-lettered
// again, with the same dead-letter id. [ListDeadLetters] returns such
// repeats once (DeadMessage.Copies), [ScanDeadLetters] marks them
// (DeadMessage.Repeat), and [Redrive] sends one copy back and drops the
// others.
package idemamqp
