module github.com/idem-go/idem/shared

go 1.26.0

require (
	github.com/idem-go/idem v0.1.0
	golang.org/x/image v0.25.0
)
