package sqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/idemq/idemq/admin"
	"github.com/idemq/idemq/internal/retry"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/core/driver"
)

// browseVisibility is how long a DeadLetters call keeps each message it
// received hidden; a heartbeat extends it every third of that while the
// call runs. A variable for tests.
var browseVisibility = 30 * time.Second

// maxEmptyReceives is how many receives in a row may come back empty
// before a call concludes the dead-letter queue gives nothing more.
const maxEmptyReceives = 3

// DeadLetters is the operator's handle on the dead-letter queue of one
// consumer's queue (admin.DeadLetterQueue): it lists, redrives and purges
// the messages parked there, whether the adapter copied them
// (DeadLetterSend) or the queue's redrive policy moved them
// (DeadLetterRedrive). It is not safe for concurrent use.
//
// SQS has no way to read a message without receiving it, so each call
// receives the messages parked when it began (ten per ReceiveMessage),
// keeps them hidden while it runs (extending their visibility as needed),
// and makes those it did not redrive or purge visible again at once when
// it returns. Receiving raises their ApproximateReceiveCount; a consumer
// of the dead-letter queue sees them only after the call. The call stops
// after ApproximateNumberOfMessages (read when it began) messages, or
// after a few empty receives (waiting up to the browse visibility when the
// queue hides messages the call did not get, as after a lost answer).
//
// On a FIFO dead-letter queue SQS hands out no more messages of a message
// group while one of the group's is hidden, so a call sees per group only
// those its first receive of that group returns (up to ten); once they are
// redriven or purged, the next call sees the ones behind them.
type DeadLetters struct {
	cl     *awssqs.Client
	cfg    config
	q      *queueInfo // the consumer's queue
	dlq    *queueInfo
	dests  map[string]*queueInfo // destination queues by name
	closed bool
}

var _ admin.DeadLetterQueue = (*DeadLetters)(nil)

// OpenDeadLetters returns the dead-letter queue of the consumer of
// queueURLOrName, which Open would open with the same options: the queue
// WithDeadLetterQueue names, else the target of the queue's redrive policy
// (always the latter with WithDeadLetterMode(DeadLetterRedrive)). Options
// only a Source uses are accepted and ignored. It creates nothing.
func OpenDeadLetters(ctx context.Context, queueURLOrName string, opts ...Option) (*DeadLetters, error) {
	cfg, cl, q, err := setup(ctx, "OpenDeadLetters", queueURLOrName, opts)
	if err != nil {
		return nil, err
	}
	target, err := deadLetterTarget(&cfg, q)
	if err != nil {
		return nil, err
	}
	dlq, err := resolveDeadLetterQueue(ctx, &cfg, cl, q, target)
	if err != nil {
		return nil, err
	}
	return &DeadLetters{cl: cl, cfg: cfg, q: q, dlq: dlq, dests: map[string]*queueInfo{q.name: q}}, nil
}

func openDeadLettersURL(ctx context.Context, u *url.URL, cfg driver.OpenConfig) (admin.DeadLetterQueue, error) {
	queue, opts, err := parseURL(u, true, cfg)
	if err != nil {
		return nil, err
	}
	return OpenDeadLetters(ctx, queue, opts...)
}

// Name returns the dead-letter queue's name.
func (d *DeadLetters) Name() string { return d.dlq.name }

// QueueURL returns the dead-letter queue's URL.
func (d *DeadLetters) QueueURL() string { return d.dlq.url }

// Close marks the handle closed; later calls fail. The SQS client needs no
// closing.
func (d *DeadLetters) Close() error {
	d.closed = true
	return nil
}

// Scan calls fn with each message parked when it began, in the order SQS
// hands them out (no order on a standard queue, group order on a FIFO
// one), and leaves them all parked. It holds only the receipt handles of
// the messages it saw, not their bodies.
//
// Cause is the idemq-cause attribute of a copy DeadLetterSend made, or,
// for a message the redrive policy moved, a sentence saying it passed the
// policy's maxReceiveCount. Attempt is the idemq-attempt attribute, or the
// maxReceiveCount for a message moved from the consumer's own queue (its
// last receive by a consumer). ParkedAt is the copy's SentTimestamp, or
// for a moved message its original SentTimestamp (earlier than the move).
func (d *DeadLetters) Scan(ctx context.Context, fn func(*admin.Parked) error) error {
	l, err := d.browse(ctx, func(h *held) error { return fn(h.p) })
	return errors.Join(err, l.release())
}

// Redrive sends each message sel chooses (every one when sel is nil) back
// to its Destination, the queue it was dead-lettered from, with its
// original body and attributes but without idemq-cause, idemq-source-queue
// and idemq-attempt (attributes the copy had folded are unfolded, and
// folded again when more than ten), and deletes it from the dead-letter
// queue once SQS accepted the send. On a FIFO destination it keeps the
// MessageGroupId and uses a new MessageDeduplicationId, so SQS does not
// drop it as a repeat of the original within its deduplication window. The
// chosen messages are held in memory until they are sent.
//
// When the queue dead-letters through its redrive policy
// (DeadLetterRedrive) and sel chose every message, Redrive asks SQS to
// move them back itself (StartMessageMoveTask, which also moves messages
// parked while it runs) and waits for the task, calling progress as its
// count of moved messages grows. Where the endpoint does not support move
// tasks (fauxqs, for one), it sends and deletes them one by one as above.
func (d *DeadLetters) Redrive(ctx context.Context, sel func(*admin.Parked) bool, progress func(done int)) (int, error) {
	var chosen []*held
	seen := 0
	l, err := d.browse(ctx, func(h *held) error {
		seen++
		if sel == nil || sel(h.p) {
			chosen = append(chosen, h)
		}
		return nil
	})
	if err != nil {
		return 0, errors.Join(err, l.release())
	}
	if progress == nil {
		progress = func(int) {}
	}
	if d.cfg.deadLetterMode == DeadLetterRedrive && len(chosen) == seen && seen > 0 && allMoved(chosen) {
		n, err := d.moveTask(ctx, l, progress)
		if !errors.Is(err, errMoveUnsupported) {
			return n, errors.Join(err, l.release())
		}
	}
	done := 0
	for _, h := range chosen {
		if err = d.redriveOne(ctx, l, h); err != nil {
			break
		}
		h.p, h.raw = nil, nil // sent: its body need not stay in memory
		done++
		progress(done)
	}
	return done, errors.Join(err, l.release())
}

// Purge deletes the messages sel chooses (every one when sel is nil) from
// the dead-letter queue, ten per DeleteMessageBatch, and returns how many
// SQS deleted.
func (d *DeadLetters) Purge(ctx context.Context, sel func(*admin.Parked) bool) (int, error) {
	var chosen []string
	l, err := d.browse(ctx, func(h *held) error {
		if sel == nil || sel(h.p) {
			chosen = append(chosen, h.ref)
		}
		return nil
	})
	if err != nil {
		return 0, errors.Join(err, l.release())
	}
	n := 0
	var errs []error
	for start := 0; start < len(chosen); start += 10 {
		refs := chosen[start:min(start+10, len(chosen))]
		entries := make([]types.DeleteMessageBatchRequestEntry, len(refs))
		for i, ref := range refs {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(l.receipt(ref))}
		}
		out, err := d.cl.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(d.dlq.url), Entries: entries})
		if err != nil {
			errs = append(errs, fmt.Errorf("sqs: purge %s: %w", d.dlq.name, err))
			break
		}
		failed := entryErrors(out.Failed)
		for i, ref := range refs {
			if e, bad := failed[i]; bad {
				errs = append(errs, fmt.Errorf("sqs: purge %s: message %s: %w", d.dlq.name, ref, e.err))
				continue
			}
			l.drop(ref)
			n++
		}
	}
	return n, errors.Join(append(errs, l.release())...)
}

// held is one parked message a call received and keeps hidden.
type held struct {
	ref   string // the SQS MessageId
	raw   *types.Message
	p     *admin.Parked
	moved bool // moved by the redrive policy rather than copied
}

// allMoved reports whether the redrive policy moved every one of hs.
func allMoved(hs []*held) bool {
	for _, h := range hs {
		if !h.moved {
			return false
		}
	}
	return true
}

// browse receives the messages parked when it begins and calls each once
// per message, keeping them hidden in the returned lease (never nil),
// which the caller releases. An error from each stops it.
func (d *DeadLetters) browse(ctx context.Context, each func(*held) error) (*lease, error) {
	l := newLease(d)
	if d.closed {
		return l, errors.New("sqs: dead-letter queue handle closed")
	}
	a, err := d.cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(d.dlq.url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages},
	})
	if err != nil {
		return l, fmt.Errorf("sqs: dead-letter queue %s: reading its size: %w", d.dlq.name, err)
	}
	parked, _ := strconv.Atoi(a.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
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
			if time.Now().After(strays) || !d.hidesMore(ctx, l) {
				break
			}
			empties, calls = 0, calls-1
		}
		out, err := d.cl.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(d.dlq.url),
			MaxNumberOfMessages:         10,
			WaitTimeSeconds:             1,
			VisibilityTimeout:           int32(browseVisibility / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			return l, fmt.Errorf("sqs: dead-letter queue %s: receive: %w", d.dlq.name, err)
		}
		if len(out.Messages) == 0 {
			empties++
			continue
		}
		empties = 0
		// All are held before each sees the first, so the heartbeat keeps
		// them hidden however long each takes.
		fresh := make([]*types.Message, 0, len(out.Messages))
		for i := range out.Messages {
			if m := &out.Messages[i]; l.hold(m) {
				fresh = append(fresh, m)
			} // else handed out again: the lease has its new receipt
		}
		for _, m := range fresh {
			got++
			p, moved := d.parked(m)
			if err := each(&held{ref: aws.ToString(m.MessageId), raw: m, p: p, moved: moved}); err != nil {
				return l, err
			}
		}
	}
	return l, nil
}

// hidesMore reports whether the dead-letter queue hides more messages
// than l holds, that is whether some were received without l knowing.
func (d *DeadLetters) hidesMore(ctx context.Context, l *lease) bool {
	a, err := d.cl.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(d.dlq.url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessagesNotVisible},
	})
	if err != nil {
		return false
	}
	hidden, _ := strconv.Atoi(a.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	l.mu.Lock()
	defer l.mu.Unlock()
	return hidden > len(l.receipts)
}

// parked describes a received dead letter, and reports whether the
// redrive policy moved it (it has no idemq-cause).
func (d *DeadLetters) parked(m *types.Message) (*admin.Parked, bool) {
	headers, body := decode(m)
	sys := m.Attributes
	p := &admin.Parked{
		Ref:     aws.ToString(m.MessageId),
		ID:      headers[d.cfg.idAttribute],
		Key:     sys[string(types.MessageSystemAttributeNameMessageGroupId)],
		Headers: headers,
		Body:    body,
	}
	if ms, err := strconv.ParseInt(sys[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		p.ParkedAt = time.UnixMilli(ms)
	}
	cause, copied := headers[driver.CauseHeader]
	if copied {
		p.Cause = cause
		p.Origin = headers[AttributeSourceQueue]
		p.Attempt, _ = strconv.Atoi(headers[AttributeAttempt])
	} else {
		if arn := sys[string(types.MessageSystemAttributeNameDeadLetterQueueSourceArn)]; arn != "" {
			p.Origin = queueNameFromARN(arn)
		}
		p.Cause = "SQS moved it: its receive count passed the redrive policy's maxReceiveCount"
	}
	if p.Origin == "" {
		p.Origin = d.q.name
	}
	if !copied && p.Origin == d.q.name && d.q.redrive != nil {
		p.Attempt = d.q.redrive.maxReceiveCount
		p.Cause += fmt.Sprintf(" (%d) on %s", p.Attempt, p.Origin)
	}
	p.Destination = p.Origin
	return p, !copied
}

// bookkeeping are the attributes Redrive takes off: the adapter's
// dead-letter attributes.
var bookkeeping = []string{driver.CauseHeader, AttributeSourceQueue, AttributeAttempt}

// redriveOne sends h to its destination and then deletes it from the
// dead-letter queue.
func (d *DeadLetters) redriveOne(ctx context.Context, l *lease, h *held) error {
	dest, err := d.destination(ctx, h.p.Destination)
	if err != nil {
		return fmt.Errorf("sqs: redrive message %s: destination: %w", h.ref, err)
	}
	attrs := unfold(h.raw.MessageAttributes)
	for _, k := range bookkeeping {
		delete(attrs, k)
	}
	attrs, err = fold(attrs, d.cfg.idAttribute, AttributeEncoding, "traceparent", "tracestate")
	if err != nil {
		return fmt.Errorf("sqs: redrive message %s: %w", h.ref, err)
	}
	in := &awssqs.SendMessageInput{QueueUrl: aws.String(dest.url), MessageBody: h.raw.Body}
	if len(attrs) > 0 {
		in.MessageAttributes = attrs
	}
	if dest.fifo {
		group := h.p.Key
		if group == "" {
			group = "idemq-redriven"
		}
		// A new id: SQS would drop the original's as a repeat within its
		// five-minute deduplication window.
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		in.MessageGroupId = aws.String(group)
		in.MessageDeduplicationId = aws.String("idemq-redrive-" + hex.EncodeToString(b))
	}
	if _, err := d.cl.SendMessage(ctx, in); err != nil {
		return fmt.Errorf("sqs: redrive message %s to %s (it stays parked): %w", h.ref, dest.name, err)
	}
	if _, err := d.cl.DeleteMessage(ctx, &awssqs.DeleteMessageInput{QueueUrl: aws.String(d.dlq.url), ReceiptHandle: aws.String(l.receipt(h.ref))}); err != nil {
		return fmt.Errorf("sqs: redrive message %s: sent to %s but not deleted from %s, so it may be redriven again: %w", h.ref, dest.name, d.dlq.name, err)
	}
	l.drop(h.ref)
	return nil
}

// destination returns the queue named name, read once per handle.
func (d *DeadLetters) destination(ctx context.Context, name string) (*queueInfo, error) {
	if q, ok := d.dests[name]; ok {
		return q, nil
	}
	q, err := resolveQueue(ctx, d.cl, name)
	if err != nil {
		return nil, err
	}
	d.dests[name] = q
	return q, nil
}

// errMoveUnsupported is moveTask's error when the endpoint has no message
// move tasks.
var errMoveUnsupported = errors.New("sqs: the endpoint does not support message move tasks")

// moveTask asks SQS to move every message of the dead-letter queue back to
// its source queue, after making the ones l holds visible again, and waits
// for the task to end. It returns errMoveUnsupported, having changed
// nothing, when the endpoint does not know move tasks.
func (d *DeadLetters) moveTask(ctx context.Context, l *lease, progress func(int)) (int, error) {
	// Probe first: the held messages stay hidden if the endpoint says no.
	if _, err := d.cl.ListMessageMoveTasks(ctx, &awssqs.ListMessageMoveTasksInput{SourceArn: aws.String(d.dlq.arn), MaxResults: aws.Int32(1)}); err != nil {
		if unsupported(err) {
			return 0, errMoveUnsupported
		}
		return 0, fmt.Errorf("sqs: redrive %s: listing move tasks: %w", d.dlq.name, err)
	}
	if err := l.release(); err != nil {
		return 0, fmt.Errorf("sqs: redrive %s: making the messages visible for the move task: %w", d.dlq.name, err)
	}
	out, err := d.cl.StartMessageMoveTask(ctx, &awssqs.StartMessageMoveTaskInput{SourceArn: aws.String(d.dlq.arn)})
	if err != nil {
		return 0, fmt.Errorf("sqs: redrive %s: starting a move task: %w", d.dlq.name, err)
	}
	handle := aws.ToString(out.TaskHandle)
	reported := int64(0)
	for {
		tasks, err := d.cl.ListMessageMoveTasks(ctx, &awssqs.ListMessageMoveTasksInput{SourceArn: aws.String(d.dlq.arn), MaxResults: aws.Int32(10)})
		if err != nil {
			return int(reported), fmt.Errorf("sqs: redrive %s: watching move task: %w", d.dlq.name, err)
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
				return int(reported), fmt.Errorf("sqs: redrive %s: move task %s: %s", d.dlq.name, aws.ToString(t.Status), aws.ToString(t.FailureReason))
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
	var ae interface{ ErrorCode() string }
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "InvalidAction", "UnsupportedOperation", "UnknownOperationException", "NotImplemented", "AWS.SimpleQueueService.UnsupportedOperation":
		return true
	}
	return false
}

// lease keeps the messages a call received hidden until it releases them:
// a heartbeat extends their visibility every third of browseVisibility.
type lease struct {
	d        *DeadLetters
	mu       sync.Mutex
	receipts map[string]string // receipt handle by MessageId
	stop     chan struct{}
	done     sync.WaitGroup
	once     sync.Once
}

func newLease(d *DeadLetters) *lease {
	l := &lease{d: d, receipts: map[string]string{}, stop: make(chan struct{})}
	l.done.Add(1)
	go l.heartbeat()
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

// heartbeat extends the visibility of the held messages until release.
func (l *lease) heartbeat() {
	defer l.done.Done()
	t := time.NewTicker(browseVisibility / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), browseVisibility/3)
		if err := l.setVisibility(ctx, int32(browseVisibility/time.Second)); err != nil {
			l.d.cfg.logger.Warn("idemq sqs: extending the visibility of dead letters being browsed failed; they may show up twice", "queue", l.d.dlq.name, "error", err)
		}
		cancel()
	}
}

// release stops the heartbeat and makes the messages still held visible
// again at once. Only its first call does anything.
func (l *lease) release() error {
	var err error
	l.once.Do(func() {
		close(l.stop)
		l.done.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err = l.setVisibility(ctx, 0); err != nil {
			err = fmt.Errorf("sqs: dead-letter queue %s: making browsed messages visible again (they come back within %v): %w", l.d.dlq.name, browseVisibility, err)
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
		chunk := handles[start:min(start+10, len(handles))]
		entries := make([]types.ChangeMessageVisibilityBatchRequestEntry, len(chunk))
		for i, h := range chunk {
			entries[i] = types.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(h), VisibilityTimeout: secs}
		}
		out, err := l.d.cl.ChangeMessageVisibilityBatch(ctx, &awssqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(l.d.dlq.url), Entries: entries})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entryErrors(out.Failed) {
			errs = append(errs, e.err)
		}
	}
	return errors.Join(errs...)
}
