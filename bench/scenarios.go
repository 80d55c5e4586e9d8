package bench

// Sizes are the deliveries per run of each kind of scenario.
type Sizes struct {
	// PerMessage is for scenarios that pay a transaction per message.
	PerMessage int
	// Batched is for batched and in-memory scenarios, which need more
	// messages to run long enough to be timed.
	Batched int
	// Redis and HTTP are for those groups.
	Redis int
	HTTP  int
}

// FullSizes keep the whole report under about ten minutes on two cores.
var FullSizes = Sizes{PerMessage: 2000, Batched: 20000, Redis: 200000, HTTP: 2000}

// QuickSizes run every scenario once, for CI.
var QuickSizes = Sizes{PerMessage: 40, Batched: 200, Redis: 64, HTTP: 32}

// Scenarios returns every row of the report, grouped and in report order.
func Scenarios(sz Sizes) []*Scenario {
	var out []*Scenario
	out = append(out, postgresScenarios(sz.PerMessage, sz.Batched)...)
	out = append(out, postgres1000Scenarios(sz.Batched)...)
	out = append(out, retentionScenarios(sz.Batched)...)
	out = append(out, mysqlScenarios(sz.PerMessage, sz.Batched)...)
	out = append(out, redisScenarios(sz.Redis)...)
	out = append(out, sqliteScenarios(sz.PerMessage, sz.Batched)...)
	out = append(out, httpScenarios(sz.HTTP)...)
	out = append(out, proxyScenarios(sz.HTTP)...)
	out = append(out, consumerScenarios(sz.PerMessage, sz.Batched)...)
	return out
}
