//go:build unix

package idemhttp_test

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system) the process has used so far: on a
// shared machine, what a request costs is steadier in CPU time than in
// wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
