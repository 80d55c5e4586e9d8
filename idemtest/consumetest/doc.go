// Package consumetest is a test kit for your own message consumer: it
// proves, from your own go test, that a handler takes effect exactly once
// per message id however the broker delivers it.
//
//	func TestPaymentsConsumer(t *testing.T) {
//		db := openLedger(t, filepath.Join(consumetest.Dir(t), "ledger.db"))
//		consumetest.Run(t, consumetest.Target{
//			Deliver: func(ctx context.Context, d consumetest.Delivery) error {
//				return handlePayment(ctx, db, d.ID, d.Body) // your handler, through idem
//			},
//			Effects: func(ctx context.Context, id string) (int, error) {
//				return countCredits(ctx, db, id) // how many times id took effect
//			},
//			Subprocess: true, // the test can run again in a child process
//		}, nil)
//	}
//
// [Run] delivers fresh messages once, twice, ten times in a row, ten
// copies at once from dozens of goroutines, newest first, with the context
// cancelled in the middle of the handler, with a panic in the handler, with
// a different body under the same id and, with Target.Subprocess, with the
// process SIGKILLed in the middle of the handler and right after it
// returned (before the ack), each time redelivering as a broker does until
// the handler succeeds. Then it asks Target.Effects how many times every id
// took effect: an id with 0 effects was lost, one with 2 duplicated, and
// the failure names the scenario, the id and what happened to it. A table
// of every scenario is logged and returned as a [Report].
//
// A consumer built on idem's consumer engine (the one behind every broker
// adapter) is tested through [Engine]: Target.Deliver = consumetest.Engine(e)
// hands each delivery to e as an adapter would, retry state and dead
// letters included.
//
// # Where the faults land
//
// A handler that calls [Point] at the places where it can be interrupted
// (before its effect, between the effect and the commit) gets each fault
// at each point in turn, deterministically. A handler without points is
// cancelled and killed at delays spread over its measured duration, which
// hits the middle of the handler by chance only, and is not panicked.
// Point does nothing outside Run, so production code may keep it.
//
// # The child process
//
// With Target.Subprocess the kill scenario starts the test binary again
// with only the calling test selected (-test.run) and an environment
// variable that makes [Run] serve deliveries instead of playing scenarios.
// The test function runs again in the child up to Run, so the target must
// reach the same durable state there: a database file under [Dir] (the
// same directory in both processes), a fixed schema name, a server. Code
// after Run does not run in the child (Run skips the test there).
//
// The kit catches, among others: a handler without dedupe (twice), a
// dedupe mark committed before the effect (cancel, panic, kill), a
// check-then-insert dedupe (concurrent), a high-water-mark dedupe (out of
// order), and an in-memory dedupe that a restart forgets (kill).
package consumetest
