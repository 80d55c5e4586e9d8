module github.com/idem-go/idem/sdktest

go 1.26.0

require (
	github.com/idem-go/idem v0.1.0
	github.com/stripe/stripe-go/v82 v82.5.1
)
