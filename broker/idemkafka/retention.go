package idemkafka

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// retentionWindows returns each topic's retention as a part of the
// redelivery horizon: a group whose committed offsets are lost or reset
// re-reads everything still in the log.
func (c *Consumer) retentionWindows(ctx context.Context, cl *kgo.Client) ([]consume.Window, error) {
	switch {
	case c.cfg.TopicRetention < 0:
		return nil, nil
	case c.cfg.TopicRetention > 0:
		return []consume.Window{{Name: "configured topic retention", D: c.cfg.TopicRetention}}, nil
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range c.cfg.Topics {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType = kmsg.ConfigResourceTypeTopic
		r.ResourceName = t
		r.ConfigNames = []string{"retention.ms"}
		req.Resources = append(req.Resources, r)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("idemkafka: read topic retention (set Config.TopicRetention to skip): %w", err)
	}
	var windows []consume.Window
	for _, r := range resp.Resources {
		if err := kerrError(r.ErrorCode); err != nil {
			return nil, fmt.Errorf("idemkafka: read retention.ms of topic %q (set Config.TopicRetention to skip): %w", r.ResourceName, err)
		}
		for _, cfg := range r.Configs {
			if cfg.Name != "retention.ms" || cfg.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*cfg.Value, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("idemkafka: topic %q retention.ms %q: %w", r.ResourceName, *cfg.Value, err)
			}
			if ms < 0 {
				return nil, fmt.Errorf("%w: idemkafka: topic %q keeps records forever (retention.ms %d) and no dedupe retention %v can cover that; set Config.TopicRetention to the window in which records may be re-read",
					idem.ErrInvalidConfig, r.ResourceName, ms, c.cfg.Retention)
			}
			windows = append(windows, consume.Window{Name: fmt.Sprintf("topic %q retention.ms", r.ResourceName), D: time.Duration(ms) * time.Millisecond})
		}
	}
	return windows, nil
}
