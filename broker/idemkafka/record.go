package idemkafka

import (
	"github.com/idem-go/idem"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// NewRecord returns a record for topic whose [DefaultIDHeader] is id, or
// [idem.ContentID](value) when id is empty. Produce it with a client whose
// idempotent producer is on (franz-go's default): the broker then drops a
// producer's internal retries; the id header lets consumers drop the
// application's own retries, which the idempotent producer cannot see.
func NewRecord(topic string, value []byte, id string) *kgo.Record {
	if id == "" {
		id = idem.ContentID(value)
	}
	return &kgo.Record{Topic: topic, Value: value, Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(id)}}}
}

func kerrError(code int16) error { return kerr.ErrorForCode(code) }
