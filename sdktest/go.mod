module github.com/idem-go/idem/sdktest

go 1.26.0

require (
	github.com/idem-go/idem v0.0.0
	github.com/stripe/stripe-go/v82 v82.5.1
)

replace github.com/idem-go/idem => ../
