package kafkashare

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Kafka's defaults for share groups, used where a broker does not say.
const (
	defaultLock  = 30 * time.Second
	defaultLimit = 5
)

// groupSettings reads the group's record lock and delivery-count limit:
// the group's own config (share.record.lock.duration.ms,
// share.delivery.count.limit) where set, else the brokers' defaults for
// share groups (group.share.record.lock.duration.ms,
// group.share.delivery.count.limit), else Kafka's.
func groupSettings(ctx context.Context, cl *kgo.Client, group string) (time.Duration, int, error) {
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the cluster's metadata: %w", err)
	}
	if len(meta.Brokers) == 0 {
		return 0, 0, fmt.Errorf("the cluster named no broker")
	}
	lockMs, limit := int(defaultLock/time.Millisecond), defaultLimit
	broker, err := describe(ctx, cl, kmsg.ConfigResourceTypeBroker, strconv.Itoa(int(meta.Brokers[0].NodeID)), false)
	if err != nil {
		return 0, 0, err
	}
	readInt(broker, "group.share.record.lock.duration.ms", &lockMs)
	readInt(broker, "group.share.delivery.count.limit", &limit)
	// A broker older than group configs refuses the resource type: its
	// defaults are the group's.
	if own, err := describe(ctx, cl, kmsg.ConfigResourceTypeGroupConfig, group, true); err == nil {
		readInt(own, "share.record.lock.duration.ms", &lockMs)
		readInt(own, "share.delivery.count.limit", &limit)
	}
	if lockMs < 100 {
		return 0, 0, fmt.Errorf("record lock of %d ms: too short to renew", lockMs)
	}
	return time.Duration(lockMs) * time.Millisecond, limit, nil
}

// describe returns the configs of one resource; onlySet keeps those set on
// the resource itself.
func describe(ctx context.Context, cl *kgo.Client, typ kmsg.ConfigResourceType, name string, onlySet bool) (map[string]string, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = typ, name
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) != 1 {
		err = fmt.Errorf("%d resources in the answer", len(resp.Resources))
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return nil, fmt.Errorf("describing the configs of %s %q: %w", typ, name, err)
	}
	out := map[string]string{}
	for _, c := range resp.Resources[0].Configs {
		if c.Value != nil && (!onlySet || c.Source == kmsg.ConfigSourceGroupConfig) {
			out[c.Name] = *c.Value
		}
	}
	return out, nil
}

// readInt sets *dst to cfg[name] when that is a positive integer.
func readInt(cfg map[string]string, name string, dst *int) {
	if n, err := strconv.Atoi(cfg[name]); err == nil && n > 0 {
		*dst = n
	}
}

// setStart sets the group's share.auto.offset.reset as start says.
func setStart(ctx context.Context, cl *kgo.Client, group string, start Start) error {
	if start == StartAsIs {
		return nil
	}
	value := map[Start]string{StartFirst: "earliest", StartLast: "latest"}[start]
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Op, c.Value = "share.auto.offset.reset", kmsg.IncrementalAlterConfigOpSet, &value
	rr.Configs = append(rr.Configs, c)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Resources) == 1 {
		err = kerr.ErrorForCode(resp.Resources[0].ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("setting share.auto.offset.reset=%s (WithStart; start=as-is leaves it): %w", value, err)
	}
	return nil
}
