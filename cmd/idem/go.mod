module github.com/idem-go/idem/cmd/idem

go 1.26

require (
	github.com/idem-go/idem v0.0.0
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
)

require github.com/inconshreveable/mousetrap v1.1.0 // indirect

replace github.com/idem-go/idem => ../..
