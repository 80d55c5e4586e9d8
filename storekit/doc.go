// Package storekit is for implementers of idem stores (an [idem.Store] and
// the transactional path, [idem.Processor]), not for their users. It holds
// the rules every store must apply the same way, written once:
//
//   - [Keep]: the lease keeper (heartbeat loop) the Guard itself uses.
//
// The package has no compatibility promise beyond the module's: it changes
// with the stores that use it.
package storekit
