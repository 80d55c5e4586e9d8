package idemstoretest

import "testing"

func runProcess(t *testing.T, newEnv func(t *testing.T) ProcessEnv) {}
