// Package idemnats consumes NATS JetStream (nats.go's jetstream package)
// through idem's shared consumer engine: at-least-once deliveries in,
// exactly one effect out.
//
// # Consuming
//
// A [Consumer] pulls from an existing durable consumer with explicit acks
// and runs every message through the user's idempotent
// [consume.ProcessFunc] (a SQL store's Process, or consume.GuardProcess).
// It acks only after the effect commits; with Config.DoubleAck it waits
// for the server to confirm the ack. While a handler runs longer than the
// consumer's AckWait, the consumer sends InProgress heartbeats so that the
// server does not hand the message to someone else meanwhile.
//
// The dedupe key is the producer's Nats-Msg-Id header, never the stream
// sequence: a producer that retries a publish after a lost PubAck outside
// the stream's duplicate window creates a second stream message with a new
// sequence but the same id, and idem recognises it.
//
// # Retries and dead letters
//
// A failed handler is retried with NakWithDelay on the full-jitter
// schedule of Config.Retry. After max_attempts (or at once for a
// retry.Permanent error, an id conflict or a missing id) the message is
// published to Config.DeadLetterSubject with the consume.Header* failure
// headers plus [HeaderStream], [HeaderStreamSeq] and [HeaderDeliveries],
// and the original is terminated (Term) once the dead-letter stream has
// acknowledged the copy.
//
// # Retry state across processes
//
// NAK cannot rewrite headers, so the retry state cannot travel with the
// message; the redeliveries of one message land on any process that
// consumes the durable. The state is therefore derived from the server's
// delivery count, which every process sees, and each process's record of
// its own failures:
//
//   - attempts: every earlier delivery this process did not settle itself
//     (another process had it, or this one before a restart, or AckWait
//     expired) counts as one failed attempt. With handler failures only,
//     that is exact: the dead letter says max_attempts, and
//     [HeaderDeliveries] says the same. An infrastructure failure or an
//     unknown commit on another process counts as an attempt here, so a
//     message can be dead-lettered sooner under an outage, never later;
//   - first failure: exact when the process that dead-letters saw the
//     first failure; otherwise the message's stream timestamp (when it was
//     stored), the earliest the first failure can have been. JetStream
//     keeps no time of a message's first delivery;
//   - last failure and last error: the dead-lettering process's own.
//
// # Dead-letter ids
//
// A dead letter's Nats-Msg-Id is its dead-letter id ([DeadLetterID], also
// in consume.HeaderDeadLetterID), derived from the original's stream and
// sequence; the original's Nats-Msg-Id is kept in consume.HeaderOriginalID.
// A dead letter published again after a crash before the original was
// terminated (the original comes back after AckWait) is dropped by the
// dead-letter stream's duplicate window, which must therefore exceed
// AckWait plus a handler's run (start-up refuses one shorter than
// AckWait).
//
// # The dedupe window
//
// [NewConsumer] does no I/O. [Consumer.Ping], and [Consumer.Run] before
// it starts, read the consumer's AckWait and MaxDeliver and the stream's
// duplicate window, and refuse to start when the dedupe
// retention is shorter than the longest of max_attempts × max_backoff,
// AckWait × MaxDeliver and the duplicate window; the error names both
// numbers. It also refuses a MaxDeliver lower than max_attempts (the
// server would give up before idem dead-letters), a dead-letter subject
// that no stream captures, and a dead-letter stream whose duplicate window
// is shorter than AckWait.
//
// # Publishing
//
// [Publisher] sets Nats-Msg-Id to the caller's id or to idem.ContentID, the
// SHA-256 of the content, and reports when the stream dropped the publish
// as a duplicate inside its window. Broker-level dedupe reduces
// duplicates; it does not replace the idempotent consumer: after the
// window the same content is accepted again, and only the consumer's
// dedupe record keeps its effect single.
//
// # The outbox publisher
//
// [OutboxPublisher] is the outbox relay's publisher (package outbox):
// Message.Topic is the subject, Message.ID the Nats-Msg-Id (the consumer's
// dedupe key), Message.Headers become NATS headers. A batch is sent with
// PublishMsgAsync and every PubAck awaited, so a batch costs about one
// round trip; a PubAck reporting a duplicate (the relay published the
// event before a crash) confirms it like a first one. A subject no stream
// captures, a message over the connection's max payload or the stream's
// maximum message size, and an invalid subject, header or id are
// permanent (the relay dead-letters the event); a disconnection or a
// missing ack within OutboxConfig.AckTimeout is idem.Retryable (an outage
// the relay retries with the same id without counting it toward
// MaxAttempts).
//
// # Tests
//
// The tests run against the NATS server of IDEM_NATS_URL, with uniquely
// named streams deleted afterwards; without it they skip, and under CI
// they fail.
package idemnats
