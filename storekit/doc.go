// Package storekit is for implementers of idem stores (an [idem.Store] and
// the transactional path, [idem.Processor]), not for their users. It holds
// the rules every store must apply the same way, written once:
//
//   - [Judge] (and [JudgeClaim] for a store that answers with claims): what
//     an existing record means for a message: Duplicate, Mismatch, a live
//     lease, or gone so that the insert should run again;
//   - [ValidateBatch], [Firsts] and [SettleRepeats]: batch validation with
//     the store's limit, and the verdict on keys repeated inside a batch;
//   - [Keep]: the lease keeper (heartbeat loop) the Guard itself uses;
//   - [Gate] and [HolderConns]: the connections a pool keeps for lease
//     holders, so that a heartbeat never queues behind a burst of claims;
//   - [Coalescer]: concurrent calls of one kind sent as one store call
//     (idemredis's claims and completions, idempgx's heartbeats);
//   - [NewStep]: the verdict on one more step of an operation
//     (idem.StepStore) and the step to write;
//   - [ListOrdered]: idem.Lister for a store that reads its records in
//     (scope, key) order, with the filter applied in Go, a bounded cost per
//     call and an opaque cursor ([Position], [ParseCursor]).
//
// idempgx, idemsqlite, idemmysql and idemredis use it. The package has no
// compatibility promise beyond the module's: it changes with the stores
// that use it.
package storekit
