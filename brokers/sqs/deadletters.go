package sqs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/unsettled"
	"github.com/idemq/idemq/internal/retry"
)

// browseVisibility is how long a DeadLetters call keeps each message it
// received hidden; a heartbeat extends it every third of that while the
// call runs. A variable for tests.
var browseVisibility = 30 * time.Second

// maxEmptyReceives is how many receives in a row may come back empty
// before a call concludes the dead-letter queue gives nothing more.
const maxEmptyReceives = 3

// DeadLetters is the operator's handle on the dead-letter queue of one
// consumer's queue (admin.DeadLetterQueue), whether the adapter copied the
// messages there (DeadLetterSend) or the redrive policy moved them
// (DeadLetterRedrive). It is not safe for concurrent use.
//
// SQS cannot read a message without receiving it, so each call receives the
// messages parked when it began (ApproximateNumberOfMessages), keeps them
// hidden while it runs (a heartbeat extends their visibility) and makes
// those still parked visible again when it returns; a consumer of the
// dead-letter queue sees them only after the call. On a FIFO dead-letter
// queue SQS hands out no more of a message group while one is hidden, so a
// call sees per group only what its receives return.
//
// A message the redrive policy moved has no idemq-cause: its Cause says it
// passed the policy's maxReceiveCount, and its Attempt is that count when
// it came from the consumer's own queue. ParkedAt is the copy's
// SentTimestamp (for a moved message, the original's). Redrive sends the
// original body and attributes (unfolded, folded again past ten) and, on a
// FIFO queue, the MessageGroupId under a new MessageDeduplicationId, which
// SQS would otherwise drop as a repeat.
type DeadLetters struct {
	*deadletter.Queue[*held]
	s *dlqStore
}

// dlqStore is the dead-letter queue as deadletter.Queue reads it.
type dlqStore struct {
	cl     *awssqs.Client
	cfg    config
	q, dlq *queueInfo // the consumer's queue and its dead-letter queue
	dests  queues
	cur    *lease // of the call in progress
	closed bool
}

// held is one parked message a call received and keeps hidden.
type held struct {
	raw   *types.Message
	moved bool // moved by the redrive policy rather than copied
}

// OpenDeadLetters returns the dead-letter queue of the consumer of the
// queue addr names (an sqs:// URL, as admin.OpenDeadLetters takes it),
// which Open would open with the same options: the queue
// WithDeadLetterQueue names, else the target of the queue's redrive policy
// (always the latter with WithDeadLetterMode(DeadLetterRedrive)). Options
// only a Source uses are accepted and ignored. It creates nothing.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	u, err := parseAddr("OpenDeadLetters", addr)
	if err != nil {
		return nil, err
	}
	return openDeadLetters(ctx, u, driver.OpenConfig{}, opts)
}

func openDeadLetters(ctx context.Context, u *url.URL, oc driver.OpenConfig, opts []Option) (*DeadLetters, error) {
	cfg, cl, q, err := setup(ctx, "OpenDeadLetters", u, oc, true, opts)
	if err != nil {
		return nil, err
	}
	dlq, err := deadLetterQueue(ctx, &cfg, cl, q, true)
	if err != nil {
		return nil, err
	}
	s := &dlqStore{cl: cl, cfg: cfg, q: q, dlq: dlq, dests: queues{cl: cl, m: map[string]*queueInfo{q.name: q}}}
	return &DeadLetters{Queue: deadletter.New(s), s: s}, nil
}

// QueueURL returns the dead-letter queue's URL.
func (d *DeadLetters) QueueURL() string { return d.s.dlq.url }

// Redrive implements admin.DeadLetterQueue. When the queue dead-letters
// through its redrive policy (DeadLetterRedrive), sel is nil and the policy
// moved every parked message, it asks SQS to move them back itself
// (StartMessageMoveTask, which also moves messages parked while it runs)
// and waits for the task, calling progress as its count of moved messages
// grows. Otherwise, or where the endpoint does not support move tasks, it
// sends and deletes them one by one.
func (d *DeadLetters) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(done int)) (int, error) {
	if d.s.cfg.deadLetterMode == DeadLetterRedrive && sel == nil {
		n, err := d.s.moveAll(ctx, progress)
		if !errors.Is(err, errMoveUnsupported) {
			return n, err
		}
	}
	return d.Queue.Redrive(ctx, sel, progress)
}

// Name is the dead-letter queue's name.
func (s *dlqStore) Name() string { return s.dlq.name }

// Close marks the handle closed; later calls fail. The SQS client needs no
// closing.
func (s *dlqStore) Close() error {
	s.closed = true
	return nil
}

// Each receives the messages parked when it begins, keeping them hidden,
// and makes those still parked visible again when it returns.
func (s *dlqStore) Each(ctx context.Context, fn func(*held, *admin.Parked) error) error {
	err := s.browse(ctx, fn)
	return errors.Join(err, s.cur.release())
}

// Republish sends h back to its destination with its original attributes
// (unfolded, and folded again when more than ten), the bookkeeping left
// out.
func (s *dlqStore) Republish(ctx context.Context, h *held, p *admin.Parked) error {
	dest, err := s.dests.get(ctx, p.Destination)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	attrs := unfold(h.raw.MessageAttributes)
	for _, k := range deadletter.Bookkeeping {
		delete(attrs, k)
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return sendCopy(ctx, s.cl, dest, h.raw.Body, attrs, s.cfg.idAttribute, p.Key, "idemq-redriven", "idemq-redrive-"+hex.EncodeToString(b))
}

// Remove deletes h from the dead-letter queue.
func (s *dlqStore) Remove(ctx context.Context, h *held) error {
	ref := aws.ToString(h.raw.MessageId)
	if _, err := s.cl.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(s.dlq.url), ReceiptHandle: aws.String(s.cur.receipt(ref))}); err != nil {
		return err
	}
	s.cur.drop(ref)
	return nil
}

// browse receives the messages parked when it begins and calls fn once per
// message, keeping them hidden in s.cur, which the caller releases. An
// error from fn stops it.
func (s *dlqStore) browse(ctx context.Context, fn func(*held, *admin.Parked) error) error {
	l := newLease(s)
	s.cur = l
	if s.closed {
		return errors.New("sqs: dead-letter queue handle closed")
	}
	parked, err := s.count(ctx, types.QueueAttributeNameApproximateNumberOfMessages)
	if err != nil {
		return fmt.Errorf("sqs: dead-letter queue %s: reading its size: %w", s.dlq.name, err)
	}
	// Each receive that is not empty brings at least one message: the
	// bound holds even when SQS hands some out twice. A receive whose
	// answer was lost on the way (the SDK retried it) leaves its messages
	// hidden for browseVisibility without the lease knowing them: while
	// some are missing and the queue hides more than the lease holds, the
	// call waits for them to come back, up to that long.
	strays := time.Time{}
	for got, empties, calls := 0, 0, 0; got < parked && calls < parked+maxEmptyReceives; calls++ {
		if empties >= maxEmptyReceives {
			if strays.IsZero() {
				strays = time.Now().Add(browseVisibility + 5*time.Second)
			}
			hidden, err := s.count(ctx, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)
			if time.Now().After(strays) || err != nil || hidden <= l.len() {
				break
			}
			empties, calls = 0, calls-1
		}
		out, err := s.cl.ReceiveMessage(ctx, receiveInput(s.dlq.url, 10, time.Second, browseVisibility))
		if err != nil {
			return fmt.Errorf("sqs: dead-letter queue %s: receive: %w", s.dlq.name, err)
		}
		if len(out.Messages) == 0 {
			empties++
			continue
		}
		empties = 0
		// All are held before fn sees the first, so the heartbeat keeps
		// them hidden however long fn takes.
		fresh := make([]*types.Message, 0, len(out.Messages))
		for i := range out.Messages {
			if m := &out.Messages[i]; l.hold(m) {
				fresh = append(fresh, m)
			} // else handed out again: the lease has its new receipt
		}
		for _, m := range fresh {
			got++
			p, moved := s.parked(m)
			if err := fn(&held{raw: m, moved: moved}, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// count reads a count attribute of the dead-letter queue.
func (s *dlqStore) count(ctx context.Context, name types.QueueAttributeName) (int, error) {
	a, err := s.cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(s.dlq.url), AttributeNames: []types.QueueAttributeName{name}})
	if err != nil {
		return 0, err
	}
	n, _ := strconv.Atoi(a.Attributes[string(name)])
	return n, nil
}

// parked describes a received dead letter, and reports whether the
// redrive policy moved it (it has no idemq-cause).
func (s *dlqStore) parked(m *types.Message) (*admin.Parked, bool) {
	headers, body := decode(m)
	sys := m.Attributes
	p := &admin.Parked{Ref: aws.ToString(m.MessageId), ID: headers[s.cfg.idAttribute], Key: sys[string(types.MessageSystemAttributeNameMessageGroupId)], Headers: headers, Body: body}
	if ms, err := strconv.ParseInt(sys[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		p.ParkedAt = time.UnixMilli(ms)
	}
	_, copied := headers[driver.CauseHeader]
	if !copied {
		p.Origin = queueNameFromARN(sys[string(types.MessageSystemAttributeNameDeadLetterQueueSourceArn)])
		p.Cause = "SQS moved it: its receive count passed the redrive policy's maxReceiveCount"
	}
	deadletter.Read(p)
	p.Origin = cmp.Or(p.Origin, s.q.name)
	if !copied && p.Origin == s.q.name && s.q.redrive != nil {
		p.Attempt = s.q.redrive.maxReceiveCount
		p.Cause += fmt.Sprintf(" (%d) on %s", p.Attempt, p.Origin)
	}
	p.Destination = cmp.Or(p.Destination, p.Origin)
	return p, !copied
}

// errMoveUnsupported is moveAll's error when a move task does not apply.
var errMoveUnsupported = errors.New("sqs: no message move task for this dead-letter queue")

// moveAll asks SQS to move every message of the dead-letter queue back to
// its source queue and waits for the task to end. It returns
// errMoveUnsupported, having changed nothing, when the endpoint does not
// know move tasks or some parked message is a copy the policy did not move.
func (s *dlqStore) moveAll(ctx context.Context, progress func(int)) (int, error) {
	// Probe first: nothing is received if the endpoint says no.
	if _, err := s.cl.ListMessageMoveTasks(ctx, &awssqs.ListMessageMoveTasksInput{SourceArn: aws.String(s.dlq.arn), MaxResults: aws.Int32(1)}); err != nil {
		if unsupported(err) {
			return 0, errMoveUnsupported
		}
		return 0, fmt.Errorf("sqs: redrive %s: listing move tasks: %w", s.dlq.name, err)
	}
	seen, moved := 0, true
	err := s.browse(ctx, func(h *held, _ *admin.Parked) error {
		seen++
		moved = moved && h.moved
		return nil
	})
	if err != nil || seen == 0 || !moved {
		return 0, errors.Join(cmp.Or(err, errMoveUnsupported), s.cur.release())
	}
	if err := s.cur.release(); err != nil {
		return 0, fmt.Errorf("sqs: redrive %s: making the messages visible for the move task: %w", s.dlq.name, err)
	}
	out, err := s.cl.StartMessageMoveTask(ctx, &awssqs.StartMessageMoveTaskInput{SourceArn: aws.String(s.dlq.arn)})
	if err != nil {
		return 0, fmt.Errorf("sqs: redrive %s: starting a move task: %w", s.dlq.name, err)
	}
	handle := aws.ToString(out.TaskHandle)
	reported := int64(0)
	if progress == nil {
		progress = func(int) {}
	}
	for {
		tasks, err := s.cl.ListMessageMoveTasks(ctx, &awssqs.ListMessageMoveTasksInput{SourceArn: aws.String(s.dlq.arn), MaxResults: aws.Int32(10)})
		if err != nil {
			return int(reported), fmt.Errorf("sqs: redrive %s: watching move task: %w", s.dlq.name, err)
		}
		for _, t := range tasks.Results {
			if aws.ToString(t.TaskHandle) != handle {
				continue
			}
			for ; reported < t.ApproximateNumberOfMessagesMoved; reported++ {
				progress(int(reported + 1))
			}
			switch aws.ToString(t.Status) {
			case "COMPLETED":
				return int(reported), nil
			case "FAILED", "CANCELLED":
				return int(reported), fmt.Errorf("sqs: redrive %s: move task %s: %s", s.dlq.name, aws.ToString(t.Status), aws.ToString(t.FailureReason))
			}
		}
		if !retry.Sleep(ctx, time.Second) {
			return int(reported), ctx.Err()
		}
	}
}

// unsupported reports whether err says the endpoint does not implement the
// operation.
func unsupported(err error) bool {
	switch code, _ := apiError(err); code {
	case "InvalidAction", "UnsupportedOperation", "UnknownOperationException", "NotImplemented", "AWS.SimpleQueueService.UnsupportedOperation":
		return true
	}
	return false
}

// lease keeps the messages a call received hidden until it releases them:
// a heartbeat extends their visibility every third of browseVisibility.
type lease struct {
	s        *dlqStore
	mu       sync.Mutex
	receipts map[string]string // receipt handle by MessageId
	stop     context.CancelFunc
	done     sync.WaitGroup
	once     sync.Once
}

func newLease(s *dlqStore) *lease {
	run, stop := context.WithCancel(context.Background())
	l := &lease{s: s, receipts: map[string]string{}, stop: stop}
	l.done.Go(func() {
		unsettled.Heartbeat(run, browseVisibility/3, func(time.Time) {
			ctx, cancel := context.WithTimeout(run, browseVisibility/3)
			defer cancel()
			if err := l.setVisibility(ctx, int32(browseVisibility/time.Second)); err != nil && run.Err() == nil {
				cmp.Or(s.cfg.logger, slog.Default()).Warn("idemq sqs: extending the visibility of dead letters being browsed failed; they may show up twice", "queue", s.dlq.name, "error", err)
			}
		})
	})
	return l
}

// hold records m's receipt handle and reports whether m is new to the
// lease.
func (l *lease) hold(m *types.Message) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, had := l.receipts[aws.ToString(m.MessageId)]
	l.receipts[aws.ToString(m.MessageId)] = aws.ToString(m.ReceiptHandle)
	return !had
}

func (l *lease) receipt(ref string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.receipts[ref]
}

// drop forgets a message deleted from the queue.
func (l *lease) drop(ref string) {
	l.mu.Lock()
	delete(l.receipts, ref)
	l.mu.Unlock()
}

func (l *lease) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.receipts)
}

// release stops the heartbeat and makes the messages still held visible
// again at once. Only its first call does anything.
func (l *lease) release() error {
	var err error
	l.once.Do(func() {
		l.stop()
		l.done.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err = l.setVisibility(ctx, 0); err != nil {
			err = fmt.Errorf("sqs: dead-letter queue %s: making browsed messages visible again (they come back within %v): %w", l.s.dlq.name, browseVisibility, err)
		}
		l.mu.Lock()
		clear(l.receipts)
		l.mu.Unlock()
	})
	return err
}

// setVisibility sets the visibility of every held message to secs, ten per
// ChangeMessageVisibilityBatch.
func (l *lease) setVisibility(ctx context.Context, secs int32) error {
	l.mu.Lock()
	handles := make([]string, 0, len(l.receipts))
	for _, h := range l.receipts {
		handles = append(handles, h)
	}
	l.mu.Unlock()
	var errs []error
	for start := 0; start < len(handles); start += 10 {
		failed, err := visibilityBatch(ctx, l.s.cl, l.s.dlq.url, handles[start:min(start+10, len(handles))], func(int) int32 { return secs })
		errs = append(errs, err)
		for _, e := range failed {
			errs = append(errs, e.err)
		}
	}
	return errors.Join(errs...)
}
