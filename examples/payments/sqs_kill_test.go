package main

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestSQSKilledHoldComesBackWithinTenSeconds kills the service (SIGKILL)
// while it holds the last payments of a run, received but not committed,
// on a queue made with SQS's defaults (a 30s VisibilityTimeout) and a
// broker URL that sets no visibility: the restarted service commits the
// last of them within 10s of the kill. The Source's own visibility timeout
// (sqs.DefaultVisibilityTimeout, 6s) bounds how long after the heartbeat's
// last extension, which comes before the kill, they stay hidden; the rest
// is the restart of the service, a receive and a commit.
func TestSQSKilledHoldComesBackWithinTenSeconds(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	endpoint := servicetest.SQSEndpoint(t)
	queue, dlq := servicetest.SQSQueues(t, endpoint, "payments-")
	// Defaults but for the long-poll wait, which delays no visible message
	// (a poll returns as soon as one is) and, at 20s, only the final stop.
	broker := "sqs://test:test@" + queue + "?" + url.Values{
		"endpoint": {endpoint}, "region": {"us-east-1"}, "dlq": {dlq}, "wait": {"1s"},
	}.Encode()
	r := killRun{store: store, tables: prefix, ledger: l, batch: 10, concurrency: 2}
	bin := serviceBinary(t)
	// The kill lands at 94% of the run; the last 60 fit the Consumer's window
	// (80), so the service holds them all at once.
	const first, last = 900, 60
	seeds := [2]uint64{1, 2} // the ids of the two parts differ (pay-SEED-N)
	publish := func(n int, seed uint64) {
		t.Helper()
		out, err := exec.Command(bin, "--broker", broker, "--publish", strconv.Itoa(n), "--duplicates", "0", "--seed", strconv.FormatUint(seed, 10)).CombinedOutput()
		if err != nil {
			t.Fatalf("publish: %v\n%s", err, out)
		}
	}
	var unique []sent
	want := map[string]int64{}
	for i, n := range []int{first, last} {
		_, u := traffic(seeds[i], n, 0, 50)
		unique = append(unique, u...)
		for _, p := range u {
			want[p.Account] += p.AmountCents
		}
	}
	rows := func() int { return ledgerRows(l) }
	waitRows := func(n int, within time.Duration) {
		t.Helper()
		servicetest.WaitFor(t, within, fmt.Sprintf("%d ledger rows", n), func() bool { return rows() >= n })
	}

	logs := t.TempDir()
	publish(first, seeds[0])
	cmd := startService(t, bin, filepath.Join(logs, "run-0.log"), r.serviceArgs(broker), nil)
	waitRows(first, 2*time.Minute)

	// The ledger refuses writes while the last payments arrive: the service
	// receives them all and holds them, its transactions waiting.
	ctx := context.Background()
	lock, err := pgx.Connect(ctx, servicetest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	tx, err := lock.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ledger, _ := tableNames(prefix)
	if _, err := tx.Exec(ctx, `LOCK TABLE `+ledger+` IN EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	publish(last, seeds[1])
	servicetest.WaitFor(t, 30*time.Second, "the service to hold the last payments", func() bool {
		visible, inflight := sqsCounts(t, endpoint, queue)
		return visible == 0 && inflight == last
	})
	if n := rows(); n != first {
		t.Fatalf("%d ledger rows while the ledger was locked, want %d", n, first)
	}

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	cmd = startService(t, bin, filepath.Join(logs, "run-1.log"), r.serviceArgs(broker), nil)
	waitRows(first+last, 2*time.Minute)
	took := time.Since(killed)
	t.Logf("SQS-KILL from the SIGKILL to the last held payment committed: %v", took.Round(10*time.Millisecond))
	// 10s is the bound; 5s more for a restart of a -race build on a loaded
	// machine. With the queue's 30s the messages came back 20s to 30s after
	// the kill.
	if took > 15*time.Second {
		t.Errorf("the last held payment was committed %v after the kill, want within 10s (plus 5s of margin)", took.Round(10*time.Millisecond))
	}
	stopService(t, "run 1", cmd, filepath.Join(logs, "run-1.log"))
	checkLedger(t, l, unique, want)
}

// sqsCounts returns the visible and in-flight message counts of a queue.
func sqsCounts(t *testing.T, endpoint, queue string) (visible, inflight int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := servicetest.SQSClient(endpoint)
	u, err := cl.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(queue)})
	if err != nil {
		t.Fatal(err)
	}
	a, err := cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: u.QueueUrl, AttributeNames: []types.QueueAttributeName{
		types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatal(err)
	}
	visible, _ = strconv.Atoi(a.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	inflight, _ = strconv.Atoi(a.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return visible, inflight
}
