// Package consume is the broker-agnostic consumer engine that idem's broker
// adapters (RabbitMQ, NATS JetStream, Kafka) share: an adapter translates its
// broker's message into a [Delivery] and the [Engine] decides its fate.
//
// # What the engine does with a delivery
//
//   - It derives the dedupe key from the producer's message id (or, when
//     configured, the SHA-256 of the body) and the fingerprint from the body.
//   - It runs the user's idempotent [ProcessFunc]: [Transactional] over a
//     SQL store (an idem.Processor: dedupe record and effect in one
//     transaction; [TransactionalBatch] for batches) or [GuardProcess] over
//     an idem.Guard for effects outside the database.
//   - idem.Processed or idem.Duplicate: the delivery is acked, only after
//     the commit.
//   - A handler error is retried with full-jitter backoff through
//     [Delivery.Retry] until the retry policy's MaxAttempts, and then
//     dead-lettered with its failure metadata ([DeadLetter]).
//   - retry.Permanent errors are dead-lettered at once; the same id with a
//     different payload is dead-lettered with reason idem.DeadMismatch.
//   - Infrastructure errors (idem.IsRetryable: a lost database connection,
//     a serialization failure) are retried with backoff but never count
//     toward MaxAttempts, so an outage does not fill the dead letters.
//   - A commit whose outcome is unknown (idem.ErrCommitUnknown) is neither
//     acked nor counted: the delivery goes back to the broker and its
//     redelivery is deduped.
//
// # Metadata headers
//
// The retry state travels with the message in headers (see [State.Headers]
// and [ParseState]); dead letters carry the same headers plus the reason,
// the consumer and the origin, so that the dead-letter tools can show why a
// message failed and where to send it back. A dead letter also carries the
// original message's id ([HeaderOriginalID]) and its own id
// ([HeaderDeadLetterID], [DeadLetterID]), derived by the adapter from the
// original delivery's place in the broker: a delivery re-read after a crash
// and dead-lettered again produces the same dead-letter id, which the
// broker's own dedupe (NATS) or the reader of the dead letters (Kafka,
// RabbitMQ) uses to keep one.
//
// # Hooks
//
// Config.Hooks takes any values (idem.Hook); the engine calls those that
// implement [DeliveryStartHook] before a delivery is handled, threading the
// context they return to the handler, and those that implement
// [DeliveryEndHook] once when it is settled, also on a panic. [Counters]
// is an end hook; contrib/idemprom and contrib/idemotel implement both.
//
// # The dedupe window
//
// [CheckRetention] refuses a dedupe retention shorter than the redelivery
// horizon; every adapter calls it at start-up.
package consume
