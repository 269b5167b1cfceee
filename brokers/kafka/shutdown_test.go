package kafka

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemq/idemq/core"
	"github.com/idemq/idemq/stores/sqlite"
)

// A Consumer asked to stop while its source is joining a group that waits
// for a dead member (a process killed without leaving) stops within its
// shutdown timeout, not once the dead member's session has run out.
func TestShutdownDuringAGroupJoinWaitingForADeadMember(t *testing.T) {
	bs := brokers(t)
	topic := newTopic(t, bs, 1)
	group := "idemq-test-" + randomHex(4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The dead member: it joins with a long session and rebalance timeout,
	// then neither heartbeats nor leaves, as a SIGKILLed consumer.
	cl := client(t, bs)
	join := kmsg.NewPtrJoinGroupRequest()
	join.Group, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis, join.ProtocolType = group, 30000, 30000, "consumer"
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	proto := kmsg.NewJoinGroupRequestProtocol()
	proto.Name, proto.Metadata = "cooperative-sticky", meta.AppendTo(nil)
	join.Protocols = append(join.Protocols, proto)
	resp, err := join.RequestWith(ctx, cl)
	if err == nil && errors.Is(kerr.ErrorForCode(resp.ErrorCode), kerr.MemberIDRequired) {
		join.MemberID = resp.MemberID
		resp, err = join.RequestWith(ctx, cl)
	}
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("the dead member's join: %v", err)
	}
	sync := kmsg.NewPtrSyncGroupRequest()
	sync.Group, sync.Generation, sync.MemberID = group, resp.Generation, resp.MemberID
	sync.ProtocolType, sync.Protocol = kmsg.StringPtr("consumer"), kmsg.StringPtr("cooperative-sticky")
	assignment := kmsg.NewConsumerMemberAssignment()
	at := kmsg.NewConsumerMemberAssignmentTopic()
	at.Topic, at.Partitions = topic, []int32{0}
	assignment.Topics = append(assignment.Topics, at)
	sa := kmsg.NewSyncGroupRequestGroupAssignment()
	sa.MemberID, sa.MemberAssignment = resp.MemberID, assignment.AppendTo(nil)
	sync.GroupAssignment = append(sync.GroupAssignment, sa)
	if sresp, err := sync.RequestWith(ctx, cl); err != nil || sresp.ErrorCode != 0 {
		t.Fatalf("the dead member's sync: %v, %v", err, sresp)
	}

	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "idemq.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	// The source's Close goes on after the test: it must not log to t.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := Open(context.Background(), bs, append(fastGroup(t), WithTopic(topic), WithGroup(group), WithLogger(quiet),
		// A rebalance may wait this long for members to rejoin.
		WithGroupTimeouts(2*time.Second, 50*time.Millisecond, 30*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := core.New[*sql.Tx](src, store, func(context.Context, *sql.Tx, *core.Message) error { return nil },
		core.WithName("test"), core.WithLogger(quiet), core.WithShutdownTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	// The source's join now waits for the dead member to rejoin.
	time.Sleep(2 * time.Second)
	if src.Stats().Assigned != 0 {
		t.Fatalf("the source joined a generation: the dead member did not hold the join up")
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second): // half the dead member's 30s: the join was waited out
		t.Fatal("Run did not return while the group join waited for the dead member")
	}
}
