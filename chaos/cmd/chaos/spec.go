package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/retry"
)

// spec is what the run process tells a worker: the scenario, the private
// names of this run and the addresses to use (a relay's when the scenario
// puts one in between). It travels in the CHAOS_SPEC environment variable.
type spec struct {
	Scenario string
	// Run names this scenario's private resources (schema, queue, stream,
	// topic, Redis prefix).
	Run    string
	Worker int
	// Servers: URLs or addresses, possibly a relay's.
	Postgres, AMQP, NATS, Redis, Kafka, SQLite string
	// Downstream is PostgreSQL reached directly: the external system of
	// the lease-path scenarios.
	Downstream string
	// Lease is the Guard's and the inbox's lease; AckWait is the NATS
	// consumer's.
	Lease   time.Duration
	AckWait time.Duration
	// Role is "relay" for an outbox relay process (outbox.go), "" for a
	// consumer.
	Role string `json:",omitempty"`
}

const specEnv = "CHAOS_SPEC"

func (s spec) env() string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return specEnv + "=" + string(b)
}

func specFromEnv() (spec, error) {
	var s spec
	v := os.Getenv(specEnv)
	if v == "" {
		return s, fmt.Errorf("%s is not set: the worker mode is started by `chaos run`", specEnv)
	}
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return s, fmt.Errorf("%s: %w", specEnv, err)
	}
	return s, nil
}

// Names of a run's private resources.
func (s spec) schema() string       { return "chaos_" + s.Run }
func (s spec) queue() string        { return "chaos." + s.Run }
func (s spec) stream() string       { return "CHAOS_" + strings.ToUpper(s.Run) }
func (s spec) deadStream() string   { return s.stream() + "_DEAD" }
func (s spec) subject() string      { return "chaos." + s.Run + ".in" }
func (s spec) deadSubject() string  { return "chaos." + s.Run + ".dead" }
func (s spec) topic() string        { return "chaos." + s.Run }
func (s spec) deadTopic() string    { return "chaos." + s.Run + ".dead" }
func (s spec) redisPrefix() string  { return "chaos:" + s.Run + ":" }
func (s spec) consumerName() string { return "chaos-" + s.Run }

// The messages: a body is "ID|KIND". KIND ok has an effect; perm fails with
// a permanent error (dead at once, reason permanent); fail fails every time
// (dead after MaxAttempts, reason max_attempts).
const (
	kindOK   = "ok"
	kindPerm = "perm"
	kindFail = "fail"
)

func body(id, kind string) []byte { return []byte(id + "|" + kind) }

func parseBody(b []byte) (id, kind string) {
	id, kind, _ = strings.Cut(string(b), "|")
	return id, kind
}

// expectedReason is the dead-letter reason a poison kind must get.
func expectedReason(kind string) idem.DeadReason {
	switch kind {
	case kindPerm:
		return idem.DeadPermanent
	case kindFail:
		return idem.DeadMaxAttempts
	}
	return ""
}

// errPoison is what a poison message's handler returns.
func poison(kind string) error {
	switch kind {
	case kindPerm:
		return retry.Permanent(fmt.Errorf("chaos: poison message (permanent)"))
	case kindFail:
		return fmt.Errorf("chaos: poison message (fails every attempt)")
	}
	return nil
}

// policy is every consumer's retry policy: short, so that the poison
// messages are dead within the run.
func policy() *retry.Policy {
	return &retry.Policy{Base: 20 * time.Millisecond, Cap: 200 * time.Millisecond, MaxAttempts: maxAttempts}
}

const maxAttempts = 3
