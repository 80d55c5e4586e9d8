// Package idemkafka consumes Kafka topics (franz-go) through idem: batches
// in, exactly one effect per record out, offsets committed only after the
// effects.
//
// # Batches and offsets
//
// A [Consumer] polls its consumer group and hands each partition's fetch
// to the user's [ProcessBatchFunc] as one batch: bound to a SQL store's
// ProcessBatch (idemsqlite, idempgx), that is one dedupe round trip and
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
// [DefaultIDHeader]; [NewRecord] sets it to the caller's id or the SHA-256
// of the value). Without it the key is topic-partition-offset
// ([OffsetKey]): weaker, because it recognises redeliveries but not a
// producer that wrote the same event twice at two offsets. Kafka's
// idempotent producer (on by default in franz-go) removes the producer's
// internal retries, not the application's own.
//
// # Failures
//
// When a batch fails with a handler error, its records are run one at a
// time through the shared consume.Engine, in order, retried in process with
// full-jitter backoff up to max_attempts; then each failing record is
// produced to the dead-letter topic (Config.DeadLetterTopic, default the
// record's topic + ".dlq") with the consume.Header* failure headers and
// [HeaderTopic], [HeaderPartition] and [HeaderOffset]. A retry.Permanent
// error, an id reused with a different payload and a missing id (under
// [DeadLetterMissingID]) go there at once. Store outages (idem.Retryable)
// retry the whole batch without counting toward max_attempts.
//
// # The dedupe window
//
// [NewConsumer] reads each topic's retention.ms (or takes
// Config.TopicRetention) and refuses to start when the dedupe retention is
// shorter than it or than max_attempts × max_backoff: a group whose offsets
// are reset re-reads everything still in the log. The error names both
// numbers.
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
