// Package idemkafka consumes Kafka topics (franz-go) through idem: batches
// in, exactly one effect per record out, offsets committed only after the
// effects.
//
// # Batches and offsets
//
// A [Consumer] polls its consumer group and hands each partition's fetch
// to the shared consume.Engine as one batch, which calls Config.BatchProcess
// (a consume.BatchProcessFunc; [RecordOf] gives each delivery's record)
// once: bound to a SQL store's ProcessBatch (idemsqlite, idempgx, through
// consume.TransactionalBatch), that is one dedupe round trip and
// one transaction for the effects of the fresh records; bound to the Redis
// store's ProcessBatch (idemredis), for effects outside any database, one
// round trip to claim the batch and one to complete it. Only after the
// batch commits does the consumer mark the offset after the highest
// contiguous settled record of the partition and commit it; a record that
// is still failing holds the offset back, so nothing after it is skipped
// by a restart.
//
// # Rebalances
//
// When partitions are revoked, an in-flight batch of a revoked partition
// gets Config.RevokeGrace to finish; then it is abandoned (its context is
// cancelled and its transaction rolls back). Whatever committed is then
// committed to the group before the callback returns. The new owner reads
// from there; records whose effects committed but whose offsets did not
// are read again and recognised as duplicates.
//
// # Dedupe keys
//
// The key is the producer's id header (Config.IDHeader, default
// [DefaultIDHeader]; [NewRecord] sets it to the caller's id or
// idem.ContentID, the SHA-256 of the value). Without it the key is
// topic-partition-offset: weaker, because it recognises redeliveries but
// not a producer that wrote the same event twice at two offsets. With
// Config.NoOffsetKey such a record follows Config.MissingID instead. Kafka's
// idempotent producer (on by default in franz-go) removes the producer's
// internal retries, not the application's own.
//
// # Failures
//
// Kafka cannot redeliver one record, so the records are in-process
// deliveries (consume.InProcess): when a batch fails with a handler error,
// the engine runs its records one at a time, in order, each in a batch of
// one, and retries a failing record in process with full-jitter backoff up
// to max_attempts, holding back the records after it; then it is
// produced to the dead-letter topic (Config.DeadLetterTopic, default the
// record's topic + ".dlq") with the consume.Header* failure headers and
// [HeaderTopic], [HeaderPartition] and [HeaderOffset]. A retry.Permanent
// error, an id reused with a different payload and a missing id (under
// NoOffsetKey and consume.DeadLetterMissingID) go there at once. Store
// outages (idem.Retryable, idem.ErrCommitUnknown) retry the whole batch
// without counting toward max_attempts.
//
// A dead letter carries the original id (consume.HeaderOriginalID) and a
// dead-letter id (consume.HeaderDeadLetterID, [DeadLetterID]) derived from
// the record's topic, partition and offset. Kafka has no dedupe on
// produce across a crash: a record read again after a crash, before its
// offset was committed, is dead-lettered again, with the same dead-letter
// id. Consumers of the dead-letter topic dedupe on that id (an idemkafka
// Consumer with Config.IDHeader set to consume.HeaderDeadLetterID does).
//
// # Shutdown
//
// When Run's context ends, the in-flight batch is abandoned (its context
// ends, its transaction rolls back), the offsets of what committed are
// committed, the consumer leaves the group and closes its client, all
// within Config.ShutdownTimeout (default 10s); what is not done by then is
// abandoned and Run returns. A group coordinator that stops answering
// cannot hold the process: the group rebalances after its session timeout
// and the uncommitted records are read again and deduped.
//
// # The dedupe window
//
// [NewConsumer] does no I/O; it refuses a dedupe retention shorter than
// max_attempts × max_backoff or than Config.TopicRetention. Unless that is
// set, [Consumer.Ping] and [Consumer.Run] read each topic's retention.ms
// and refuse a dedupe retention shorter than it: a group whose offsets are
// reset re-reads everything still in the log. The error names both
// numbers. Ping also reports an unreachable cluster.
//
// # The outbox publisher
//
// [OutboxPublisher] is the outbox relay's publisher (package outbox):
// Message.Topic is the Kafka topic, Message.Key the record key (so the
// events of one key land on one partition, in order), Message.ID the
// [DefaultIDHeader] header a [Consumer] dedupes on, Message.Headers record
// headers. A batch is produced at once and each record's produce response
// awaited (OutboxConfig.AckTimeout bounds the wait). [NewOutboxPublisher]
// refuses a client whose idempotent producer is off. A record too large
// for the client or the topic's max.message.bytes, a topic that does not
// exist, an invalid topic or id are permanent (the relay dead-letters the
// event); everything else is retried by the relay with the same id header
// (an outage as idem.Retryable, not counted toward its MaxAttempts).
// The broker refuses a whole batch for one oversized record, so a record
// refused with MESSAGE_TOO_LARGE is produced once more on its own before
// it is called permanent: its batch neighbours are not dead-lettered with
// it.
//
// # Throughput
//
// BenchmarkPostgresEffects consumes 2,000 records from kfake into a
// PostgreSQL effect on a 2-core machine: one ProcessBatch per partition
// fetch ran 13,228 records/s, one Process transaction per record 335
// records/s — about 39× (go test -run '^$' -bench PostgresEffects
// -benchtime 3x, IDEM_POSTGRES_URL set). The per-record cost is one
// commit, and its fsync, per record.
//
// # Tests
//
// The tests run against franz-go's in-process kfake cluster; no Kafka
// server is needed.
package idemkafka
