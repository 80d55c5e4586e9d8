package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/contrib/idemprom"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemredis"
	"github.com/idem-go/idem/store/idemsqlite"
)

func TestOneLinePrefixes(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		// Any package named idem-something, not only those the CLI links.
		"idemkafka: idem: broker down": "idem: broker down",
		"idemnats: stream missing":     "idem: stream missing",
		"idemsqs: idemhttp: idem: x":   "idem: x",
		"idem: invalid configuration: idemsqlite: MaxResultBytes must not be negative": "idem: invalid configuration: idemsqlite: MaxResultBytes must not be negative",
		// A sentinel's "idem: " further in.
		"idemredis: nil client: idem: invalid configuration": "idem: nil client: invalid configuration",
		// Where it failed stays, once.
		"migrate: migrate: no such table":     "idem: migrate: no such table",
		"inbox: claim: connection refused":    "idem: inbox: claim: connection refused",
		"claim: connection refused":           "idem: claim: connection refused",
		"dial tcp 127.0.0.1:5432: connect: x": "idem: dial tcp 127.0.0.1:5432: connect: x",
		// Not prefixes: values, sentences, a last segment.
		`unknown store "idem: x"`:              `idem: unknown store "idem: x"`,
		"Idem: capitalised is text":            "idem: Idem: capitalised is text",
		"idem is not a prefix: here":           "idem: idem is not a prefix: here",
		"no such key: idem":                    "idem: no such key: idem",
		"x: x":                                 "idem: x: x",
		"same sentence: same sentence: twice":  "idem: same sentence: same sentence: twice",
		"idemsqlite:":                          "idem: idemsqlite:",
		"  leading\tand\r\ntrailing space \n ": "idem: leading and trailing space",
	} {
		if got := oneLine(errors.New(in)); got != want {
			t.Errorf("oneLine(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestOneLineRealErrors formats errors the stores, brokers and components
// really return, wrapped as the commands wrap them: one "idem: ", nothing
// said twice, the message kept.
func TestOneLineRealErrors(t *testing.T) {
	t.Parallel()
	errOf := func(_ any, err error) error { return err }
	tests := []struct {
		err  error
		want string // a fragment of the message that must survive
	}{
		{errOf(idemsqlite.New(nil, nil)), "nil *sql.DB"},
		{errOf(idemsqlite.Open(t.Context(), "sqlite:///nonexistent/dir/idem.db", nil)), "unable to open database file"},
		{errOf(idemsqlite.Open(t.Context(), "sqlite://"+t.TempDir()+"/idem.db", &idemsqlite.Config{MaxResultBytes: -1})), "MaxResultBytes"},
		{errOf(idempgx.New(nil, nil)), "nil pool"},
		{errOf(idemredis.New(nil, nil)), "nil client"},
		{errOf(idemamqp.NewConsumer(nil, nil)), "needs a dial function"},
		{errOf(idemprom.New(nil, nil)), "nil prometheus.Registerer"},
		{errOf(consume.New(nil, nil)), "nil ProcessFunc"},
		{errOf(idemhttp.New(nil, nil)), "nil store"},
		{fmt.Errorf("idempgx: complete: %w", idem.ErrLeaseLost), "complete"},
	}
	for _, tc := range tests {
		if tc.err == nil {
			t.Errorf("no error where one was expected (%q)", tc.want)
			continue
		}
		for _, err := range []error{tc.err, fmt.Errorf("migrate: %w", tc.err), fmt.Errorf("idem: %w", tc.err)} {
			got := oneLine(err)
			if !strings.HasPrefix(got, "idem: ") || strings.HasPrefix(got, "idem: idem") || strings.Contains(got, ": idem: ") {
				t.Errorf("oneLine(%q) = %q: want one leading \"idem: \"", err, got)
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("oneLine(%q) = %q: lost %q", err, got, tc.want)
			}
			if strings.Contains(got, "migrate: migrate: ") || strings.Contains(got, "\n") {
				t.Errorf("oneLine(%q) = %q", err, got)
			}
		}
	}
}
