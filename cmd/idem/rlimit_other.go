//go:build !unix

package main

// fdLimit is unknown off Unix.
func fdLimit() (uint64, bool) { return 0, false }
