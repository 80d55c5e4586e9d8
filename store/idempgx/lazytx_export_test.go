package idempgx

// SetPipelineBegin turns the BEGIN that travels with a transaction's first
// statement on or off (on by default), for side-by-side benchmarks.
func SetPipelineBegin(on bool) { pipelineBegin.Store(on) }
