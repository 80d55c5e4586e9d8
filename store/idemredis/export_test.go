package idemredis

// ClaimScript exposes the claim script to the driver benchmark, which runs
// it through go-redis to compare the two clients on the same work.
const ClaimScript = claimScript

// Identity exposes the claim script's first argument to the same benchmark.
var Identity = identity
