// Package outbox is the producer side of exactly-once effects: an event
// written inside the producer's own database transaction is published to
// the broker if and only if that transaction commits.
//
// This file set is being built (issue 19); see docs/architecture.md.
package outbox
