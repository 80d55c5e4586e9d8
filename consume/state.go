package consume

import (
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/retry"
)

// Header names shared by every adapter. They are lowercase so that brokers
// that fold header case (HTTP-style) keep them intact.
const (
	// HeaderAttempts is the number of counted failures so far.
	HeaderAttempts = "x-idem-attempts"
	// HeaderInfraRetries is the number of infrastructure retries so far;
	// they do not count toward MaxAttempts but grow the backoff.
	HeaderInfraRetries = "x-idem-infra-retries"
	// HeaderFirstFailure and HeaderLastFailure are RFC 3339 timestamps.
	HeaderFirstFailure = "x-idem-first-failure"
	HeaderLastFailure  = "x-idem-last-failure"
	// HeaderLastError is the last error's text, bounded in length.
	HeaderLastError = "x-idem-last-error"
	// HeaderReason is why a message was dead-lettered: an idem.DeadReason.
	HeaderReason = "x-idem-reason"
	// HeaderConsumer is the name of the consumer that dead-lettered it.
	HeaderConsumer = "x-idem-consumer"
	// HeaderOrigin names where the message was first published (for
	// RabbitMQ, the exchange and routing key).
	HeaderOrigin = "x-idem-origin"
	// HeaderOriginalID is the id the original message was deduped under
	// (the producer's id), kept in its own header because a broker's own
	// id field may carry the dead-letter id (NATS: Nats-Msg-Id).
	HeaderOriginalID = "x-idem-original-id"
	// HeaderDeadLetterID identifies the dead letter: derived from the
	// original delivery (see [DeadLetterID]), so that the same delivery
	// dead-lettered twice (re-read after a crash, before its settlement
	// reached the broker) carries the same id, and readers of the dead
	// letters can keep one of each.
	HeaderDeadLetterID = "x-idem-dead-letter-id"
)

// DeadLetterID returns the id of the dead letter of the delivery that
// parts identify, the broker's name first (Kafka: topic, partition and
// offset; NATS: stream and sequence; RabbitMQ, which gives a redelivery no
// position: queue, message id and content id): "dl-" and 64 hex digits of
// a length-prefixed SHA-256 of the parts, a valid idem key and message id.
// The same parts give the same id.
func DeadLetterID(parts ...string) string {
	bs := make([][]byte, 0, len(parts)+1)
	bs = append(bs, []byte("idem-dead-letter-v1"))
	for _, p := range parts {
		bs = append(bs, []byte(p))
	}
	return "dl-" + idem.FingerprintParts(bs...).String()
}

// State is the retry state a message carries from earlier attempts.
type State struct {
	// Attempts is the number of counted failures so far.
	Attempts int
	// InfraRetries is the number of infrastructure failures so far.
	InfraRetries int
	// FirstFailure and LastFailure are zero before the first failure.
	FirstFailure time.Time
	LastFailure  time.Time
	// LastError is the last failure's text, bounded.
	LastError string
}

// Failures returns the failures so far, as retry.Policy.Decide takes them.
func (s State) Failures() retry.Failures {
	return retry.Failures{Counted: s.Attempts, Infrastructure: s.InfraRetries}
}

// Headers returns the state as header values; zero fields are left out.
func (s State) Headers() map[string]string {
	h := map[string]string{}
	if s.Attempts > 0 {
		h[HeaderAttempts] = strconv.Itoa(s.Attempts)
	}
	if s.InfraRetries > 0 {
		h[HeaderInfraRetries] = strconv.Itoa(s.InfraRetries)
	}
	if !s.FirstFailure.IsZero() {
		h[HeaderFirstFailure] = s.FirstFailure.UTC().Format(time.RFC3339Nano)
	}
	if !s.LastFailure.IsZero() {
		h[HeaderLastFailure] = s.LastFailure.UTC().Format(time.RFC3339Nano)
	}
	if s.LastError != "" {
		h[HeaderLastError] = s.LastError
	}
	return h
}

// ParseState reads a State from headers through get, which returns a
// header's value and whether it is present. Malformed values read as zero:
// a producer cannot make a message unprocessable through them, only reset
// its own retry count.
func ParseState(get func(name string) (string, bool)) State {
	var s State
	num := func(name string) int {
		v, ok := get(name)
		if !ok {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0
		}
		return n
	}
	ts := func(name string) time.Time {
		v, ok := get(name)
		if !ok {
			return time.Time{}
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return time.Time{}
		}
		return t
	}
	s.Attempts = num(HeaderAttempts)
	s.InfraRetries = num(HeaderInfraRetries)
	s.FirstFailure = ts(HeaderFirstFailure)
	s.LastFailure = ts(HeaderLastFailure)
	if v, ok := get(HeaderLastError); ok {
		s.LastError = v
	}
	return s
}

// DeadLetter is everything a dead-lettered message carries about its
// failure.
type DeadLetter struct {
	State
	// Reason is why the message was dead-lettered.
	Reason idem.DeadReason
	// Consumer is the consumer's name.
	Consumer string
	// Origin is where the message was first published.
	Origin string
	// OriginalID is the original message's id ([Delivery.ID]), "" when it
	// had none. The engine sets it.
	OriginalID string
	// DeadLetterID identifies this dead letter (see [DeadLetterID]); the
	// adapter sets it from its delivery's position in the broker.
	DeadLetterID string
}

// Headers returns the dead letter's metadata as header values.
func (d DeadLetter) Headers() map[string]string {
	h := d.State.Headers()
	h[HeaderAttempts] = strconv.Itoa(d.Attempts)
	h[HeaderReason] = string(d.Reason)
	if d.Consumer != "" {
		h[HeaderConsumer] = d.Consumer
	}
	if d.Origin != "" {
		h[HeaderOrigin] = d.Origin
	}
	if d.OriginalID != "" {
		h[HeaderOriginalID] = d.OriginalID
	}
	if d.DeadLetterID != "" {
		h[HeaderDeadLetterID] = d.DeadLetterID
	}
	return h
}

// ParseDeadLetter reads a DeadLetter from headers (see [ParseState]). It
// reads the messages older versions dead-lettered too: their reason
// "id_conflict" reads as idem.DeadMismatch.
func ParseDeadLetter(get func(name string) (string, bool)) DeadLetter {
	d := DeadLetter{State: ParseState(get)}
	reason, _ := get(HeaderReason)
	d.Reason = parseReason(reason)
	d.Consumer, _ = get(HeaderConsumer)
	d.Origin, _ = get(HeaderOrigin)
	d.OriginalID, _ = get(HeaderOriginalID)
	d.DeadLetterID, _ = get(HeaderDeadLetterID)
	return d
}

// legacyReasons maps the dead-letter reasons older versions wrote, where
// their spelling changed, to today's.
var legacyReasons = map[string]idem.DeadReason{
	"id_conflict": idem.DeadMismatch,
}

func parseReason(s string) idem.DeadReason {
	if r, ok := legacyReasons[s]; ok {
		return r
	}
	return idem.DeadReason(s)
}
