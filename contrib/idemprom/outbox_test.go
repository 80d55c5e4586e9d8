package idemprom

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/shared/hooktest"
)

func TestOutboxHookWithRealRelay(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	hooktest.DriveOutbox(t, t.Context(), []idem.Hook{m})
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_outbox_events_total{outcome=processed,relay=default}":     2,
		"idem_outbox_events_total{outcome=retried,relay=default}":       1,
		"idem_outbox_events_total{outcome=dead_lettered,relay=default}": 1,
		"idem_outbox_events_total{outcome=lease_lost,relay=default}":    1,
		"idem_outbox_events_total{outcome=not_recorded,relay=default}":  1,
		"idem_outbox_events_total{outcome=released,relay=default}":      1,
		"idem_outbox_events_total{outcome=panicked,relay=default}":      0,
		"idem_outbox_publish_seconds{outcome=processed,relay=default}":  2,
		"idem_outbox_publish_seconds{outcome=retried,relay=default}":    1,
		"idem_outbox_publish_seconds{outcome=released,relay=default}":   1,
		// Only sent events have a lag.
		"idem_outbox_lag_seconds{relay=default}":                            2,
		"idem_outbox_dead_letters_total{reason=permanent,relay=default}":    1,
		"idem_outbox_dead_letters_total{reason=max_attempts,relay=default}": 0,
	})
	noLeaks(t, reg, "secret")
}

// With OutboxTopics, the listed topics label the events, the dead letters
// and the lag, and any other topic is "other"; For names the relay.
func TestOutboxTopicsAndRelayName(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{OutboxTopics: []string{"orders", "payments"}})
	hooktest.DriveOutbox(t, t.Context(), []idem.Hook{m.For("orders-relay")})
	got := series(t, reg)
	hooktest.WantCounts(t, got, map[string]float64{
		"idem_outbox_events_total{outcome=processed,relay=orders-relay,topic=orders}":       2,
		"idem_outbox_events_total{outcome=retried,relay=orders-relay,topic=other}":          1,
		"idem_outbox_events_total{outcome=dead_lettered,relay=orders-relay,topic=payments}": 0,
		"idem_outbox_lag_seconds{relay=orders-relay,topic=orders}":                          2,
		"idem_outbox_dead_letters_total{reason=permanent,relay=orders-relay,topic=other}":   1,
		"idem_outbox_dead_letters_total{reason=permanent,relay=orders-relay,topic=orders}":  0,
		// The time of a batch has no topic.
		"idem_outbox_publish_seconds{outcome=processed,relay=orders-relay}": 2,
	})
	for k := range got {
		if strings.Contains(k, "relay=default") {
			t.Errorf("%s: the relay has a name", k)
		}
	}
	noLeaks(t, reg, "secret")
}

// The relays of Options.Relays have their event and dead-letter series at
// zero before their first batch.
func TestRelaysAreCreatedAtZero(t *testing.T) {
	t.Parallel()
	_, reg := newMetrics(t, &Options{Relays: []string{"orders-relay", "default"}})
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_outbox_events_total{outcome=dead_lettered,relay=orders-relay}":     0,
		"idem_outbox_events_total{outcome=processed,relay=default}":              0,
		"idem_outbox_dead_letters_total{reason=max_attempts,relay=orders-relay}": 0,
	})
}

func TestMaxLabelValuesBoundsRelays(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, &Options{MaxLabelValues: 1})
	for _, name := range []string{"a", "b", "c"} {
		m.For(name).OnPublishEnd(context.Background(), outbox.Result{Outcome: idem.Processed})
	}
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_outbox_events_total{outcome=processed,relay=a}":     1,
		"idem_outbox_events_total{outcome=processed,relay=other}": 2,
	})
}

// histogramSum returns the sample sum of a histogram series, by the key
// series() uses.
func histogramSum(t *testing.T, reg prometheus.Gatherer, key string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			if mf.GetName()+"{"+strings.Join(labels, ",")+"}" == key {
				return m.GetHistogram().GetSampleSum()
			}
		}
	}
	t.Fatalf("no histogram %s", key)
	return 0
}

// The lag is the time from the event's creation to the end hook; a
// creation time in the future (clock skew) counts as zero, and an event
// without one is not observed.
func TestOutboxLag(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	ctx := context.Background()
	send := func(created time.Time) {
		m.OnPublishEnd(ctx, outbox.Result{Message: outbox.Message{ID: "a", Topic: "t", Attempt: 1, CreatedAt: created},
			Outcome: idem.Processed, Duration: 3 * time.Millisecond})
	}
	before := time.Now()
	send(before.Add(-90 * time.Second))
	send(time.Now().Add(time.Hour))
	send(time.Time{})
	elapsed := time.Since(before).Seconds()
	hooktest.WantCounts(t, series(t, reg), map[string]float64{"idem_outbox_lag_seconds{relay=default}": 2})
	sum := histogramSum(t, reg, "idem_outbox_lag_seconds{relay=default}")
	if sum < 90 || sum > 90+elapsed {
		t.Errorf("lag sum %v, want 90s (+ %vs)", sum, elapsed)
	}
	if got := histogramSum(t, reg, "idem_outbox_publish_seconds{outcome=processed,relay=default}"); math.Abs(got-3*0.003) > 1e-9 {
		t.Errorf("publish seconds sum %v, want the reported durations", got)
	}
}

// A Relay with several loops reports from several goroutines.
func TestOutboxConcurrentRelay(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, nil)
	const events = 300
	hooktest.DriveConcurrentOutbox(t, []idem.Hook{m, m.For("second")}, events)
	hooktest.WantCounts(t, series(t, reg), map[string]float64{
		"idem_outbox_events_total{outcome=processed,relay=default}": events,
		"idem_outbox_events_total{outcome=processed,relay=second}":  events,
		"idem_outbox_lag_seconds{relay=default}":                    events,
	})
}

// BenchmarkOutboxHook is the hook's cost per event, as the relay calls it
// for a batch of 100 sent events.
func BenchmarkOutboxHook(b *testing.B) {
	m, err := New(prometheus.NewRegistry(), nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	created := time.Now()
	rs := make([]outbox.Result, 100)
	for i := range rs {
		rs[i] = outbox.Result{Message: outbox.Message{ID: fmt.Sprint(i), Topic: "orders", Attempt: 1, CreatedAt: created},
			Outcome: idem.Processed, Duration: time.Millisecond}
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, r := range rs {
			m.OnPublishEnd(ctx, r)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/event")
}
