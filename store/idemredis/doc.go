// Package idemredis is the Redis store for idem: an [idem.Store] for
// high-rate, lower-stakes flows (notifications, analytics counters, caches
// of expensive calls) where a claim is one Lua script instead of a SQL
// transaction. It works on a single Redis server and on Redis Cluster.
//
//	client, _ := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
//	store, err := idemredis.New(client, &idemredis.Config{Strict: true})
//	err = store.Ping(ctx) // at start-up: servers reachable, noeviction
//	guard := idem.NewGuard(store, nil)
//
// The store takes the application's own [rueidis.Client] and never closes it.
// [New] does no I/O (like every idem store's constructor); [Store.Ping]
// talks to the servers.
//
// # Durability
//
// Redis acknowledges a write before it is on disk (with appendfsync
// everysec, up to a second of writes can be lost) and replicates
// asynchronously, so a crash or a failover can lose records. A lost record
// is a forgotten key: the next delivery of that message runs again. In other
// words, if Redis loses data, duplicates can pass. Use the Redis store where
// an occasional duplicate after a Redis failure is acceptable, and the SQL
// stores (idempgx, idemsqlite), whose dedupe record commits in the same
// transaction as the effect, for money and anything else that must never
// happen twice.
//
// # Keys and Redis Cluster
//
// A record is one Redis string at
//
//	prefix + "{" + hex(SHA-256(len(scope) ‖ scope ‖ len(key) ‖ key)) + "}"
//
// with 8-byte big-endian lengths (the bytes of [idem.FingerprintParts]).
// The lengths make ("a:b", "c") and ("a", "b:c") different keys whatever
// delimiters scope and key contain; the digest is the cluster hash tag, so
// records spread over all slots. Even two pairs that did share a digest
// would not share a record: the claim script compares the scope and key
// stored in the record with the caller's and refuses a record of another
// pair ([ErrRecordFormat]) instead of replaying it. Every script
// touches its own keys only, and a claim call batches several keys only on
// a standalone or sentinel client, so the store is cluster-safe by
// construction. The prefix must not contain braces.
//
// # Record format
//
// The value is a fixed 127-byte header (format version '1', state,
// failed and tombstone flags, the token in 20 decimal digits, created,
// lease expiry, completed and expiry times in 16 digits of milliseconds,
// the 32-byte fingerprint, the lengths of scope and key), then scope, key
// and, once completed, the result; scripts.go has the byte map. It is
// readable with redis-cli GET. A key that holds anything else (another
// Redis type, another format version, a corrupt header) is never read as a
// record nor overwritten: Get, Claim, Complete, Extend and Release return
// an error wrapping [ErrRecordFormat]. [Store.Delete] removes such a key.
//
// # Scripts and the store clock
//
// Claim, Complete, Extend, Release and Delete are each one Lua script, run
// with EVALSHA and, after a NOSCRIPT (a restarted or new server), EVAL, so
// each is atomic. Every scope, key, fingerprint, token and duration reaches
// the scripts through KEYS and ARGV; no script is ever built from input.
//
// Lease and retention expiry are computed inside the scripts from
// redis.call('TIME'), the server's clock, never from the application's;
// Redis 7 replicates script effects, so TIME is allowed there. Every record
// is written with SET … PXAT equal to its ExpiresAt:
//
//   - in progress: lease expiry + [Config.AbandonedRetention] (default 24h),
//     so that a late claim still sees the stale lease and reports Takeover,
//     and an expired lease that nobody took over can still Complete;
//   - completed: completion time + the retention given to Complete.
//
// Times are kept in milliseconds. A claim of a fresh key, the hot path, is
// one SET NX GET, which writes the new record if the key is absent and
// otherwise returns what is there without writing; only then does the
// script look at the old value (replay, in progress, mismatch, takeover, or
// a stub) and, if it acquires, SET it again. A fresh claim's reply is one
// integer, and so is the reply of a call whose claims were all fresh (the
// token; Go derives each lease from it), or whose completions all succeeded;
// a record travels back only when a claim did not acquire.
//
// # Batched claims
//
// Concurrent claims share script calls, and so do concurrent completions.
// A claim that finds nothing queued and fewer than two calls in flight is
// sent at once, alone, from its caller's goroutine, as without batching.
// Claims that arrive while two calls are in flight queue; a sender
// goroutine sends up to [Config.Coalesce] (default 64) queued claims with
// the same lease as one call, and keeps sending what queued meanwhile until
// the queue is empty. One call reads TIME once and formats the record
// header once, then claims its keys one after the other, each atomically,
// in arrival order: the same key twice in one call behaves as two calls.
// Completions batch the same way, each record checked against its own
// token. There is no timer; a claim waits only while the server is busy
// with earlier ones. Errors are per item: one key holding a value of
// another type fails its own claim, not the others in its call.
//
// A caller whose context ends stops waiting at once. A queued claim is
// then never sent; a claim already sent in a batch runs, and if it acquired
// the lease, the sender releases it, so the key does not stay in progress
// for a lease that nobody holds. A claim sent alone, on a cluster client,
// or with Coalesce 1 is one call through the client's auto-pipelining; if
// its context ends while it is in flight, it may still be applied (see
// below).
//
// # Claiming a batch
//
// A consumer that receives messages in batches (a Kafka fetch, a JetStream
// Fetch, an inbox claim) claims them with [Store.ClaimBatch] and completes
// them with [Store.CompleteBatch]: each request still gets its own
// outcome, token and error, in order, but the requests go out as few
// script calls as Coalesce allows, all in one round trip from the caller's
// goroutine, with no queue and no hand-off. This is the shape of
// redis-benchmark's pipelined ceiling, and where the store comes closest to
// it (see the throughput section). An invalid request or a batch over
// [MaxBatch] is refused before anything is sent; a failure of a whole
// script call (the server went away) is returned as the batch's error and
// carried by each item of that call.
//
// [Store.ProcessBatch] does the whole lease cycle for a batch in the shape
// of the SQL stores' ProcessBatch, so a batch consumer binds it the same
// way; with idemkafka:
//
//	BatchProcess: func(ctx context.Context, msgs []idem.Message, ds []consume.Delivery) ([]idem.Outcome, error) {
//		return store.ProcessBatch(ctx, msgs, func(ctx context.Context, fresh []int) error {
//			for _, i := range fresh {
//				if err := notify(ctx, idemkafka.RecordOf(ds[i])); err != nil {
//					return err // the batch's leases are released; the consumer retries
//				}
//			}
//			return nil
//		})
//	},
//
// It claims the batch in one round trip, heartbeats the fresh messages'
// leases while the handler runs, and completes them in one more. Its
// effects are outside Redis, so, unlike the SQL stores' transaction, a
// failure after they ran (a lease lost, Redis gone before the completion)
// can run them again: the lease path's at-least-once edge, as for
// [idem.Guard].
//
// # Fencing tokens
//
// A token is max(previous token + 1, Redis TIME in microseconds), so tokens
// strictly increase per (scope, key):
//
//   - while the record exists (in progress, completed, or an expired lease
//     being taken over), its own token field gives the "+1";
//   - Release and Delete do not remove the key: they replace the record by a
//     24-byte stub holding its token ('1x00' + token, TTL one hour), which
//     Get, Delete and Claim treat as absent; the next claim overwrites the
//     stub with a token above it. No second key is needed;
//   - after retention or the stub's hour, when no trace of the key is left
//     (also after a failover that lost the last writes), the clock part
//     keeps tokens increasing, as long as the Redis clock does not step
//     back further than the time since the previous token was issued. A
//     per-key counter that was lost would restart at 1 and repeat tokens;
//     the clock does not.
//
// The stub covers the one case the clock does not: a claim right after a
// Release or Delete following a backward clock step of up to an hour.
// Purge removes nothing (see below), so it cannot lower a token either.
// Tokens are large numbers (about 1.7e15 in 2025); they fit an int64 and a
// Lua double exactly, and the scripts format them with %d (a 64-bit C long
// in Redis's Lua) so Redis does not round them.
//
// # Retention and Purge
//
// Redis deletes each record at its ExpiresAt by itself, and an expired key
// is invisible to every command from that moment on, so Get never returns
// an expired record and a claim after the retention starts afresh. [Store.Purge]
// has nothing left to do and returns 0. It does not SCAN the keyspace: that
// would cost O(all keys) for no benefit. (The conformance suite runs with
// ExpiresByTTL, which checks that expired records are gone without
// counting what Purge removed.)
//
// # Listing
//
// [Store.List] implements [idem.Lister] for operators (idem keys list and
// find) with SCAN MATCH on the store's prefix, never KEYS: at most 10 SCANs
// of COUNT 500 a call, then one pipelined GETRANGE of the header, scope and
// key of each record found (not its result); on a cluster, each master in
// turn. Its cost per page is bounded, and so is a page's share of a long
// listing: a filter that matches few records gives short or empty pages
// with a next cursor. A SCAN call is never repeated (after a write or a
// resize it may return other keys): the records it found beyond a page's
// Limit travel in the cursor.
//
// # Memory and eviction
//
// An evicted record is a silent duplicate, so [Store.Ping] reads maxmemory-policy
// on every node the client knows: anything but noeviction, or a server
// that hides CONFIG (common on managed services), is logged as a warning,
// or is an [ErrEvictionPolicy] error with [Config.Strict]. When Redis is
// full with noeviction, it refuses writes with an OOM error; the store
// fails closed: Claim returns an error wrapping [ErrOutOfMemory] (also
// marked [idem.Retryable]: nothing was recorded) and nothing runs. Reads
// still work: a completed record is replayed and a live lease reported. So
// does Release, because it only frees memory (it deletes the record before
// writing the smaller stub; Redis refuses only a script's first write).
//
// Transport errors and transient server states (LOADING, TRYAGAIN,
// CLUSTERDOWN, MASTERDOWN, READONLY, BUSY) are marked [idem.Retryable]. A
// claim whose reply was lost (a dropped connection; a context that ended on
// the unbatched path) may have been applied; the key then stays in progress
// until the lease expires, and the retry gets ErrInProgress until then: the
// safe direction. A sender whose connection broke gives it back to the pool
// and takes a fresh one for the next call.
//
// # Client choice: rueidis
//
// Both Go clients ran the claim script, one key per call, against the same
// Redis 7.0.15 on this project's 2-core development machine, 64 concurrent
// callers, fresh keys, side by side in one run (three runs each, before
// batching):
//
//	go test -run '^$' -bench 'BenchmarkClaim/(StoreUnbatched|GoRedisScript)$' -benchtime 50000x -count 3 ./store/idemredis
//
//	rueidis v1.0.79 (auto-pipelined, through Store.Claim)   57,000–77,000 claims/s
//	go-redis v9.23.0 (pool of 64 connections, bare script)  30,000–44,000 claims/s
//
// rueidis writes the concurrent calls of many goroutines as one pipeline on
// a few connections, so client and server spend far fewer system calls per
// claim; go-redis gives each caller a connection and a round trip. The
// store uses rueidis: about 1.3–2.5 times the throughput.
//
// # Throughput against Redis's own ceiling
//
// `make bench` (bench/cmd/idembench, BENCHMARKS.md) runs, interleaved five
// times against one server, 200,000 fresh keys each: redis-benchmark with
// 64 clients and 16 commands pipelined on each (the ceiling the target is
// set against), go-redis with 64 callers pipelining 16 SET NX PX each, 64
// callers of unpipelined SET NX PX, Store.Claim with 64 callers, and
// Store.ClaimBatch with 64 callers of 16 keys each (the ceiling's depth):
//
//	redis-benchmark -c 64 -n 200000 -P 16 -r 1000000000 --csv SET idembench:…:__rand_int__ 1 NX PX 60000
//
// BENCHMARKS.md has the latest run. On the 2-core development machine
// (client and server share the two cores; the ceiling swings by a factor of
// two to three between runs), BenchmarkClaim gave, three runs each:
//
//	go test -run '^$' -bench 'BenchmarkClaim/(Store|StoreBatch16|SetNXPX|RedisBenchmarkP16)$' \
//	    -benchtime 200000x -count 3 ./store/idemredis
//
//	redis-benchmark -P 16 SET NX PX, 64 clients (ceiling)     133,000–340,000/s (median 292,000)
//	Store.ClaimBatch, 64 callers × 16 keys                     168,000–178,000/s
//	Store.Claim, 64 callers (batched)                          105,000–112,000/s
//	SET NX PX through rueidis, the same 64 callers              84,000–106,000/s
//
// and an earlier run, Store.Claim with Coalesce 1 at 73,000–78,000/s and
// redis-benchmark -P 1 (64 clients, unpipelined) at 46,000–47,000/s.
//
// In `make bench` (medians of five interleaved runs) Store.ClaimBatch ×16
// reached 48–59% of the redis-benchmark ceiling, Store.Claim 30–37%, as
// fast as the bare SET NX PX sent by the same 64 callers one at a time,
// and the whole lease cycle (Claim, then Complete with a result) 15%;
// ClaimBatch + CompleteBatch, 23–24%.
//
// The ceiling keeps 1,024 commands in flight (64 connections, 16 deep); 64
// callers that each wait for one answer keep at most 64, which is why even
// the bare command from Go stays near a third of it on this machine, and
// Store.Claim in the same place. At the same depth, ClaimBatch ×16 is
// about half the ceiling: what is left is the server's own work, a claim's
// SET NX GET PXAT of a record of about 140 bytes, called from Lua, against
// a bare SET NX PX.
//
// Batching is what moved the single-claim ratio: one claim per call (the
// Coalesce 1 row above) reached 19–29% of the ceiling in the runs before
// batching.
//
// A lone claim goes out as it did without batching; a few concurrent
// callers pay a goroutine hand-off per batch, and from about 8 callers
// batching pays. Medians of three runs, batched against Coalesce 1
// (claims/s, or Claim + Complete cycles/s), on the same machine:
//
//	go test -run '^$' -bench BenchmarkBatching -benchtime 20000x -count 3 ./store/idemredis
//
//	callers   Claim              Claim + Complete
//	1          10,500 / 12,000     7,000 /  8,300
//	4          16,600 / 16,100     7,900 / 11,600
//	8          30,700 / 21,200    15,800 / 17,500
//	64        127,000 / 75,200    50,200 / 35,900
//
// Set Coalesce to 1 for a store that only ever sees a handful of
// concurrent callers.
//
// # Requirements
//
// Redis 7 (tested with 7.0.15, standalone and a 3-master cluster): the
// claim uses SET with both NX and GET, allowed since Redis 7.0, and PXAT.
package idemredis
