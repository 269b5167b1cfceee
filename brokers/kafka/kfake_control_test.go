package kafka

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/idemq/idemq/internal/servicetest"
)

// startKfake starts a kfake cluster of its own (servicetest.NewKfake) with
// args, stopped when t ends, for tests that drive its cluster controls.
func startKfake(t testing.TB, args ...string) *servicetest.Kfake {
	t.Helper()
	k, err := servicetest.NewKfake(args...)
	if errors.Is(err, servicetest.ErrNoKfake) {
		servicetest.Unavailable(t, "no kfake for a test of cluster faults: %v", err)
	}
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(k.Stop)
	return k
}

// The cluster controls of servicetest.Kfake change what the brokers tell a
// Kafka client: partition leaders in the metadata follow MoveLeader, a
// removed broker leaves the metadata and leads nothing, and AddBroker
// brings it back on its address.
func TestKfakeClusterControls(t *testing.T) {
	k := startKfake(t, "-brokers", "3", "-topics", "ctl:3", "-auto-create=false")
	addrs := strings.Split(k.Addr, ",")
	meta := func() kadm.Metadata {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A client of its own each time (a client caches metadata),
		// asking broker 0 only: broker 1 goes away below.
		m, err := adminClient(t, addrs[0]).Metadata(ctx, "ctl")
		if err != nil {
			t.Fatalf("metadata: %v", err)
		}
		return m
	}
	leaders := func(m kadm.Metadata) []int {
		out := make([]int, 3)
		for _, p := range m.Topics["ctl"].Partitions {
			out[p.Partition] = int(p.Leader)
		}
		return out
	}
	nodes := func(m kadm.Metadata) []int {
		var out []int
		for _, b := range m.Brokers {
			out = append(out, int(b.NodeID))
		}
		slices.Sort(out)
		return out
	}

	for p, b := range []int{2, 0, 1} {
		if err := k.MoveLeader("ctl", p, b); err != nil {
			t.Fatal(err)
		}
	}
	if got := leaders(meta()); !slices.Equal(got, []int{2, 0, 1}) {
		t.Errorf("leaders %v after MoveLeader, want [2 0 1]", got)
	}
	if l, err := k.Leader("ctl", 0); err != nil || l != 2 {
		t.Errorf("Leader: %d, %v, want 2", l, err)
	}
	if err := k.ShuffleLeaders(); err != nil {
		t.Fatal(err)
	}
	if co, err := k.Coordinator("some-group"); err != nil || co < 0 || co > 2 {
		t.Errorf("Coordinator: %d, %v", co, err)
	}

	if err := k.RemoveBroker(1); err != nil {
		t.Fatal(err)
	}
	m := meta()
	if got := nodes(m); !slices.Equal(got, []int{0, 2}) {
		t.Errorf("brokers %v with broker 1 removed, want [0 2]", got)
	}
	if got := leaders(m); slices.Contains(got, 1) {
		t.Errorf("leaders %v: the removed broker 1 still leads", got)
	}
	if bs, err := k.Brokers(); err != nil || len(bs) != 2 || bs[0] != addrs[0] || bs[2] != addrs[2] {
		t.Errorf("Brokers: %v, %v", bs, err)
	}
	if err := k.MoveLeader("ctl", 0, 1); err == nil {
		t.Error("MoveLeader to the removed broker succeeded")
	}

	addr, err := k.AddBroker(1)
	if err != nil || addr != addrs[1] {
		t.Fatalf("AddBroker: %q, %v, want %s", addr, err, addrs[1])
	}
	if got := nodes(meta()); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("brokers %v with broker 1 back, want [0 1 2]", got)
	}
	if err := k.MoveLeader("ctl", 2, 1); err != nil {
		t.Fatal(err)
	}
	if got := leaders(meta()); got[2] != 1 {
		t.Errorf("leaders %v: partition 2 not led by broker 1, which is back", got)
	}
	if _, err := k.AddBroker(1); err == nil || !strings.Contains(err.Error(), "in the cluster") {
		t.Errorf("AddBroker of a broker in the cluster: %v", err)
	}
}
