package idemamqp_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/idem-go/idem/broker/idemamqp"
)

func TestScanDeadLetters(t *testing.T) {
	t.Parallel()
	topo, conn := newTopology(t)
	for i := range 5 {
		publish(t, conn, topo.DeadLetterQueue, fmt.Sprintf("m%d", i), []byte("body"), 1)
	}
	ctx := context.Background()

	var ids []string
	for m, err := range idemamqp.ScanDeadLetters(ctx, conn, topo.DeadLetterQueue, 3) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	if fmt.Sprint(ids) != "[m0 m1 m2]" {
		t.Fatalf("scan with limit 3 saw %v", ids)
	}
	// Stopping early and scanning again: nothing was consumed.
	for m := range idemamqp.ScanDeadLetters(ctx, conn, topo.DeadLetterQueue, 0) {
		if m.ID == "" {
			t.Fatal("empty id")
		}
		break
	}
	n := 0
	for _, err := range idemamqp.ScanDeadLetters(ctx, conn, topo.DeadLetterQueue, 0) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 5 {
		t.Fatalf("second scan saw %d messages, want all 5 still there", n)
	}

	errs := 0
	for _, err := range idemamqp.ScanDeadLetters(ctx, conn, topo.DeadLetterQueue+".absent", 0) {
		if err == nil {
			t.Fatal("a message from a queue that does not exist")
		}
		errs++
	}
	if errs != 1 {
		t.Fatalf("%d errors from a missing queue, want 1", errs)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	for _, err := range idemamqp.ScanDeadLetters(canceled, conn, topo.DeadLetterQueue, 0) {
		if err != context.Canceled {
			t.Fatalf("canceled scan: %v", err)
		}
	}
}
