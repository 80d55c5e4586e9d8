// Package retry computes retry delays and classifies errors for idem's
// consumers and for callers that retry on their own.
//
// # Backoff
//
// A [Policy] grows the delay exponentially, base·2^attempt, up to a cap, and
// then spreads it with a [Jitter] strategy. [FullJitter], the default, draws
// the delay uniformly from [0, min(cap, base·2^attempt)]: clients that failed
// together do not come back together. [EqualJitter] keeps half of the delay
// and randomises the other half; [NoJitter] is the plain exponential schedule,
// kept for comparison (it is what causes retry storms).
//
// # Classifying errors
//
// Handlers say what should happen to a failure by wrapping the error:
//
//   - [Permanent]: never retried (validation errors, undecodable payloads);
//     a consumer sends the message straight to the dead letters;
//   - [After]: retry, but not before the given delay (a Retry-After);
//   - errors marked with idem.Retryable (connection lost, serialization
//     failure, broker channel closed) are infrastructure failures: they are
//     retried with backoff but never count toward MaxAttempts, so a database
//     outage does not fill the dead letters;
//   - any other error is an ordinary failure, retried up to MaxAttempts.
//
// [Classify] applies these rules. [Policy.Decide] turns them into the one
// give-up decision that every consumer, the inbox and [Do] share: retry
// after a delay, or give up with an idem.DeadReason (idem.DeadPermanent,
// idem.DeadMaxAttempts). [Do] runs a function with them.
package retry
