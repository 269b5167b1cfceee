//go:build faults

package servicetest_test

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestFaultRabbitCluster starts a private 3-node cluster, checks that the
// nodes form one cluster, and that a stopped node comes back into it.
func TestFaultRabbitCluster(t *testing.T) {
	c := servicetest.StartRabbitCluster(t, 3)
	status := func() string {
		out, err := c.Ctl(0, "cluster_status")
		if err != nil {
			t.Fatalf("cluster_status: %v\n%s", err, out)
		}
		return out
	}
	st := status()
	for i := range c.Len() {
		if !strings.Contains(st, c.NodeName(i)) {
			t.Fatalf("node %s missing from the cluster:\n%s", c.NodeName(i), st)
		}
	}
	conn, err := amqp.Dial(c.NodeURL(1))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("cluster-probe", true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	leader := c.QueueLeader("cluster-probe")
	if leader < 0 {
		t.Fatalf("no leader found for cluster-probe")
	}
	t.Logf("cluster %s; leader of cluster-probe: node %d", c.URL(), leader)
	c.Stop(leader)
	if c.Running(leader) {
		t.Fatal("Running after Stop")
	}
	servicetest.WaitFor(t, 30*2e9, "a new leader", func() bool {
		l := c.QueueLeader("cluster-probe")
		return l >= 0 && l != leader
	})
	c.Start(leader)
	if !strings.Contains(status(), "Running Nodes") {
		t.Fatal("no running nodes listed")
	}
	t.Logf("after restart:\n%s", status())
}
