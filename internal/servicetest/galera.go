package servicetest

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
)

// GaleraProvider is the Galera library Debian's galera-4 installs.
const GaleraProvider = "/usr/lib/galera/libgalera_smm.so"

// GaleraCluster is a private MariaDB Galera cluster on loopback: every node
// a MariaDBServer with a port each for SQL, group communication, IST and
// SST. Node 0 bootstraps the cluster; the others join it by state transfer
// (rsync). The cluster goes when the test ends.
type GaleraCluster struct {
	// Nodes are the cluster's servers; Nodes[i].DSN reaches node i.
	Nodes []*MariaDBServer

	t     testing.TB
	gcomm []string // each node's group-communication address
}

// StartGalera starts an n-node Galera cluster and waits until every node
// is synced in one primary component of n. Without galera-4 the test
// skips, or fails when IDEMQ_REQUIRE_SERVICES=1.
func StartGalera(t testing.TB, n int) *GaleraCluster {
	t.Helper()
	if _, err := os.Stat(GaleraProvider); err != nil {
		Unavailable(t, "no %s (Debian's galera-4) to start a Galera cluster", GaleraProvider)
	}
	c := &GaleraCluster{t: t}
	for range n {
		s := newMariaDB(t)
		if os.Geteuid() == 0 {
			// The joiner's rsync daemon, started by the server, would drop
			// root for nobody and be refused its own data directory: run
			// the nodes as the mysql user instead.
			if out, err := exec.Command("chown", "-R", "mysql:mysql", s.dir).CombinedOutput(); err != nil {
				t.Fatalf("chown: %v\n%s", err, out)
			}
			s.user = "--user=mysql"
		}
		c.Nodes = append(c.Nodes, s)
		c.gcomm = append(c.gcomm, fmt.Sprintf("127.0.0.1:%d", FreePort(t)))
	}
	t.Cleanup(func() { // before the nodes' directories go
		for i, s := range c.Nodes {
			if t.Failed() {
				log := strings.Split(s.Log(), "\n")
				t.Logf("Galera node %d, the end of its log:\n%s", i, strings.Join(log[max(0, len(log)-200):], "\n"))
			}
		}
	})
	for i, s := range c.Nodes {
		ist, sst := FreePort(t), FreePort(t)
		s.args = []string{
			"--wsrep-on=ON", "--wsrep-provider=" + GaleraProvider,
			"--wsrep-cluster-name=idemq-test", fmt.Sprintf("--wsrep-node-name=node%d", i),
			"--wsrep-cluster-address=gcomm://" + strings.Join(c.gcomm, ","),
			"--wsrep-node-address=" + c.gcomm[i],
			fmt.Sprintf("--wsrep-provider-options=base_host=127.0.0.1;base_port=%s;ist.recv_addr=127.0.0.1:%d;gcache.size=64M", strings.Split(c.gcomm[i], ":")[1], ist),
			fmt.Sprintf("--wsrep-sst-receive-address=127.0.0.1:%d", sst),
			"--wsrep-sst-method=rsync",
			"--binlog-format=ROW", "--default-storage-engine=InnoDB", "--innodb-autoinc-lock-mode=2",
		}
	}
	c.Nodes[0].args = append(c.Nodes[0].args, "--wsrep-new-cluster")
	c.Nodes[0].Start()
	c.Nodes[0].args = c.Nodes[0].args[:len(c.Nodes[0].args)-1] // a restart joins
	for _, s := range c.Nodes[1:] {
		s.Start()
	}
	for i := range c.Nodes {
		c.WaitSynced(i, n)
	}
	return c
}

// Rejoin starts node i again (after Kill or Stop) and waits until it has
// caught up (IST, or SST) and is synced in a component of the cluster's
// size.
func (c *GaleraCluster) Rejoin(i int) {
	c.t.Helper()
	c.Nodes[i].Start()
	c.WaitSynced(i, len(c.Nodes))
}

// WaitSynced waits up to two minutes until node i reports itself Synced in
// a primary component of size nodes.
func (c *GaleraCluster) WaitSynced(i, size int) {
	c.t.Helper()
	var state string
	var got int
	WaitFor(c.t, 2*time.Minute, fmt.Sprintf("Galera node %d synced in a cluster of %d", i, size), func() bool {
		state, got = c.Status(i)
		return state == "Synced" && got == size
	})
}

// Status returns node i's wsrep_local_state_comment and
// wsrep_cluster_size ("" and 0 when it does not answer).
func (c *GaleraCluster) Status(i int) (state string, size int) {
	cfg, err := mysqldrv.ParseDSN(c.Nodes[i].DSN)
	if err != nil {
		return "", 0
	}
	conn, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return "", 0
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var name string
	if db.QueryRow(`SHOW STATUS LIKE 'wsrep_local_state_comment'`).Scan(&name, &state) != nil {
		return "", 0
	}
	if db.QueryRow(`SHOW STATUS LIKE 'wsrep_cluster_size'`).Scan(&name, &size) != nil {
		return state, 0
	}
	return state, size
}
