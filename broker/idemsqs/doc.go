// Package idemsqs consumes Amazon SQS queues (AWS SDK for Go v2) through
// idem's shared consumer engine: at-least-once deliveries in, exactly one
// effect out, and failures that end in a dead-letter queue a person can
// read and redrive.
//
// # Consuming
//
// A [Consumer] long-polls the work queue with a fixed number of receive
// loops, up to ten messages a receive. On a standard queue with
// Config.BatchProcess a receive is handed to the engine's HandleBatch: one
// dedupe round trip and one transaction for the receive (a SQL store's
// ProcessBatch through consume.TransactionalBatch); otherwise each message
// goes through Config.Process (consume.Transactional, consume.GuardProcess).
// The messages acked by the engine are deleted with one DeleteMessageBatch
// after the commit; a message whose delete fails, in whole or as a failed
// entry, becomes visible again and its redelivery is deduped.
// [NewConsumer] does no I/O; [Consumer.Ping] reads the queue's attributes
// and checks them (see below).
//
// # Dedupe key
//
// The key is the producer's id in the AttrID ("idem-id") message attribute,
// else the FIFO MessageDeduplicationId, else the SQS MessageId. The last is
// weaker: a producer's retried send gets a new MessageId, so only SQS's
// own redeliveries are deduplicated, not producer-side duplicates.
// [Publish] sets AttrID (the given id, or idem.ContentID of the body) and,
// on a FIFO queue, the MessageGroupId and a MessageDeduplicationId (given,
// or the id), so that SQS itself drops a producer's retry within its
// five-minute window. SQS's answer to such a send does not say it was
// dropped; the consumer deduplicates it by id either way.
//
// # Visibility, retries and dead letters
//
// While a message is handled a heartbeat renews its visibility timeout
// (ChangeMessageVisibility to Config.Visibility every Config.Heartbeat,
// default a third of it), so that a slow handler never lets SQS hand the
// message to a second consumer. A failed message is retried with full
// jitter by hiding it for the backoff delay (ChangeMessageVisibility); SQS
// cannot rewrite a message's attributes, so the retry state is kept in
// process and falls back to ApproximateReceiveCount after a restart (a
// message can be dead-lettered sooner, never later). After MaxAttempts, a
// permanent error or a payload mismatch, the message is sent to the
// dead-letter queue with its failure metadata as message attributes
// (consume.Header*: reason, attempts, first and last failure, last error,
// consumer, origin queue, and AttrOriginalID) and the producer's own
// attributes as far as SQS's ten fit, then deleted from the work queue.
//
// A queue's native redrive policy stays compatible: its maxReceiveCount
// must be above MaxAttempts (Ping refuses it otherwise: SQS would move the
// message first, without metadata), and its target is the default
// dead-letter queue. A message SQS moved on its own reads back from
// [ListDeadLetters] with reason "max_receive_count".
//
// # The window check
//
// Ping and Run refuse to start, naming the numbers, when the redelivery
// horizon, maxReceiveCount (or MaxAttempts) × the visibility timeout +
// MaxAttempts × the backoff cap (+ the five-minute FIFO window on a FIFO
// queue), is longer than the dedupe Retention or than the queue's
// MessageRetentionPeriod.
//
// # FIFO queues
//
// On a FIFO queue messages are handled one at a time, in the order of a
// receive; a message that is retried holds back the rest of its group in
// that receive (they are hidden as long as it is), while other groups go
// on. SQS delivers no further message of a group while one is in flight.
//
// # Dead letters
//
// [ListDeadLetters] reads a dead-letter queue without consuming it (the
// messages are hidden while read, then made visible again); [Redrive]
// sends chosen dead letters back to their origin queue with fresh
// attempts, up to a redrive cap; [MoveBack] lets SQS move them all back
// itself (StartMessageMoveTask); [Purge] empties a queue. The command
// line's "idem dlq sqs list|show|redrive|purge" runs them.
//
// # The outbox publisher
//
// [OutboxPublisher] is the outbox relay's publisher (package outbox):
// Message.Topic is the queue URL, Message.ID the AttrID attribute (and, on
// a FIFO queue, the MessageDeduplicationId, so SQS drops the relay's
// repeat within five minutes), Message.Key the FIFO MessageGroupId
// (OutboxConfig.DefaultGroupID without one), Message.Headers String
// attributes. Messages go out with SendMessageBatch, ten and
// MaxMessageBytes per call at most, and each entry's result is its
// message's: a sender's fault is permanent (the relay dead-letters the
// event), any other failure retried (an outage, throttling or SQS's own
// fault as idem.Retryable, not counted toward the relay's MaxAttempts). A body SQS cannot carry (empty, not
// UTF-8, characters SQS forbids), a message over MaxMessageBytes, more
// than ten attributes and a missing queue are permanent before or without
// a retry. goaws drops the attributes of batch entries, and does not
// report a FIFO message's group and deduplication id: against it the
// tests use OutboxConfig.OneByOne (one SendMessage per message) to check
// the id attribute end to end, and a fake speaking the SQS JSON protocol
// to check what a batch sends and how per-entry failures are read.
//
// # What is proven against what
//
// The package's tests run against goaws v0.4.5, a local SQS-compatible
// server that .ci/run builds from the Go module proxy and starts
// (IDEM_SQS_URL). goaws speaks only SQS's query protocol: the tests' client
// uses [QueryProtocol]; Amazon SQS speaks both. Proven against goaws:
//
//   - batch receive with duplicate publishes applied once, batched and one
//     at a time (TestDuplicatesAppliedOnce), and a consumer process
//     SIGKILLed and restarted while 2,000 messages with 30% duplicate
//     publishes flow, the ledger exact (TestCrashRestart; 10,000 with
//     IDEM_SQS_CRASH_FULL=1);
//   - a DeleteMessageBatch entry that fails: the test spoils its receipt
//     handle, the message comes back after its visibility timeout and is
//     deduped (TestFailedDeleteIsDeduped);
//   - the visibility heartbeat: a 3 s visibility timeout, a handler taking
//     10 s, two consumers, one run (TestVisibilityHeartbeat);
//   - retries through ChangeMessageVisibility, the dead letter with its
//     metadata attributes, ListDeadLetters and Redrive
//     (TestPoisonDeadLetteredAndRedriven);
//   - FIFO order per group with a failing message (TestFIFOOrderPerGroup);
//   - FIFO deduplication: ten identical publishes, one message, one effect
//     (TestExercise3IdenticalPublishes);
//   - a permanent error and a payload mismatch dead-lettered at once, and a
//     commit whose outcome is unknown handed back and deduped, on standard
//     and FIFO queues (TestOutcomes);
//   - reading a native redrive policy, its target as the default dead-letter
//     queue, and refusing a low maxReceiveCount (TestRedrivePolicy);
//   - Ping against a dead address and against missing queues.
//
// Not proven against a server: the MessageRetentionPeriod part of the
// window check (goaws does not report the attribute; TestWindowCheck checks
// it on attributes). Where goaws differs from SQS: it drops the message
// attributes of SendMessageBatch entries (the tests send one message a
// call; this package never batches sends), it ignores an unknown receipt
// handle in DeleteMessageBatch instead of failing the entry, its FIFO group
// lock is looser (locking one group releases the others, so the ordering
// test keeps every group inside one receive) and outlives a
// ChangeMessageVisibility to 0 (so a listed FIFO dead-letter queue hides
// its groups until their visibility timeout: TestOutcomes lists the
// standard one only), and it lacks StartMessageMoveTask: [MoveBack] is
// proven against a fake answering the two calls as the SQS API reference
// describes them (TestMoveBack), and on goaws it fails as it must, where
// "idem dlq sqs redrive --all --move-task" falls back to Redrive.
package idemsqs
