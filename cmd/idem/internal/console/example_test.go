package console_test

import (
	"fmt"

	"github.com/idem-go/idem/cmd/idem/internal/console"
)

// CheckListen is what "idem console" asks before it serves: a loopback
// address needs no token, any other does.
func ExampleCheckListen() {
	fmt.Println(console.CheckListen("127.0.0.1:8090", ""))
	fmt.Println(console.CheckListen("0.0.0.0:8090", "") != nil)
	fmt.Println(console.CheckListen("0.0.0.0:8090", "s3cret"))
	// Output:
	// <nil>
	// true
	// <nil>
}
