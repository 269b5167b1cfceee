package sqs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemq/idemq/core/driver"
	"github.com/idemq/idemq/core/driver/deadletter"
	"github.com/idemq/idemq/core/driver/retry"
)

// browseVisibility is how long a DeadLetters call keeps each message it
// holds hidden, extended every third of that (a variable for tests).
var browseVisibility = 30 * time.Second

// lookVisibility is the visibility a look (Scan) receives with: what it
// fails to make visible again at once stays hidden this long.
const lookVisibility = 2 * time.Second

// maxEmptyReceives is how many empty receives in a row end a call.
const maxEmptyReceives = 3

// DeadLetters is the operator's handle on the dead-letter queue of one
// consumer's queue (driver.DeadLetters and driver.Redriver), whether the adapter copied the
// messages there or the redrive policy moved them. It is not safe for
// concurrent use.
//
// SQS cannot read a message without receiving it, so each call receives the
// messages parked when it began (ApproximateNumberOfMessages). Scan, a
// look, makes each receive's messages visible again at once, before it
// reads them: another look, a redrive or a consumer of the dead-letter
// queue finds them all meanwhile. Only when SQS hands back messages it
// already listed does it hold what it receives from then on, so that the
// next receives bring the others, and release them when it returns.
// Redrive and Purge hold every message they receive while they run and
// release those still parked when they return. On a FIFO dead-letter queue
// SQS hands out no more of a message group while one is hidden, so a call
// sees per group only what its receives return. ParkedAt is a copy's
// SentTimestamp.
type DeadLetters struct {
	*deadletter.Queue[*types.Message]
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
	look   bool // the call in progress is a look (Scan)
}

// OpenDeadLetters returns the dead-letter queue of the consumer of the queue
// addr names (an sqs:// URL, as admin.OpenDeadLetters takes it): the one
// Open with the same options would park in. Options only a Source uses are
// accepted and ignored. It creates nothing.
func OpenDeadLetters(ctx context.Context, addr string, opts ...Option) (*DeadLetters, error) {
	cfg, cl, q, err := setup(ctx, "OpenDeadLetters", addr, true, opts)
	if err != nil {
		return nil, err
	}
	dlq, err := deadLetterQueue(ctx, &cfg, cl, q, true)
	if err != nil {
		return nil, err
	}
	s := &dlqStore{cl: cl, cfg: cfg, q: q, dlq: dlq, dests: queues{cl: cl}}
	s.dests.m.Store(q.name, q)
	return &DeadLetters{Queue: deadletter.NewBatched(s), s: s}, nil
}

// QueueURL returns the dead-letter queue's URL.
func (d *DeadLetters) QueueURL() string { return d.s.dlq.url }

// Redrive implements driver.Redriver. In DeadLetterRedrive mode, when
// sel is nil and the policy moved every parked message, SQS is asked to
// move them back itself (StartMessageMoveTask) where the endpoint can;
// otherwise each is sent back and then deleted.
func (d *DeadLetters) Redrive(ctx context.Context, sel func(*driver.Parked) bool, progress func(done int)) (int, error) {
	if d.s.cfg.deadLetterMode == DeadLetterRedrive && sel == nil {
		n, err := d.s.moveAll(ctx, progress)
		if !errors.Is(err, errMoveUnsupported) {
			return n, err
		}
	}
	return d.Queue.Redrive(ctx, sel, progress)
}

// Scan implements driver.DeadLetters, hiding no message longer than it
// takes to read it (see DeadLetters).
func (d *DeadLetters) Scan(ctx context.Context, fn func(*driver.Parked) error) error {
	d.s.look = true
	defer func() { d.s.look = false }()
	return d.Queue.Scan(ctx, fn)
}

// Name is the dead-letter queue's name.
func (s *dlqStore) Name() string { return s.dlq.name }

// Close marks the handle closed; later calls fail.
func (s *dlqStore) Close() error {
	s.closed = true
	return nil
}

// EachBatch receives the messages parked when it begins, a receive at a
// time (see browse), and makes those still held visible when it returns.
func (s *dlqStore) EachBatch(ctx context.Context, fn func([]*types.Message, []*driver.Parked) error) error {
	err := s.browse(ctx, s.look, fn)
	return errors.Join(err, s.cur.release())
}

// Republish sends m back to its destination with its original attributes
// (unfolded, folded again past ten) but the bookkeeping, on a FIFO queue
// under a new MessageDeduplicationId: SQS would drop the old as a repeat.
func (s *dlqStore) Republish(ctx context.Context, m *types.Message, p *driver.Parked) error {
	dest, err := s.dests.get(ctx, p.Destination)
	if err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	attrs := unfold(m.MessageAttributes)
	for _, k := range deadletter.Bookkeeping {
		delete(attrs, k)
	}
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return sendCopy(ctx, s.cl, dest, m.Body, attrs, s.cfg.idAttribute, p.Key, "idemq-redriven", "idemq-redrive-"+hex.EncodeToString(b))
}

// RemoveBatch deletes ms, held by EachBatch, with one DeleteMessageBatch.
func (s *dlqStore) RemoveBatch(ctx context.Context, ms []*types.Message) []error {
	hs := make([]*string, len(ms))
	for i, m := range ms {
		held, _ := s.cur.receipts.Load(aws.ToString(m.MessageId)) // the latest, should SQS have handed m out again
		h, _ := held.(*string)
		hs[i] = cmp.Or(h, aws.String(""))
	}
	errs, _ := inBatches(ctx, hs, 0, deletes(s.cl, s.dlq.url, hs))
	for i, m := range ms {
		if errs[i] == nil {
			s.cur.receipts.Delete(aws.ToString(m.MessageId))
		}
	}
	return errs
}

// browse receives the messages parked when it begins and calls fn with
// each receive's new ones, holding them in s.cur, which the caller
// releases. A look makes them visible again before fn sees them, until
// SQS hands back only messages it listed. An error from fn stops it.
func (s *dlqStore) browse(ctx context.Context, look bool, fn func([]*types.Message, []*driver.Parked) error) error {
	l := newLease(s)
	s.cur = l
	if s.closed {
		return errors.New("sqs: dead-letter queue handle closed")
	}
	parked, err := s.count(ctx, types.QueueAttributeNameApproximateNumberOfMessages)
	if err != nil {
		return fmt.Errorf("sqs: dead-letter queue %s: reading its size: %w", s.dlq.name, err)
	}
	// Each receive that is not empty brings a message not listed, or one
	// not held, or (a look's, once) makes the call hold, so the bound holds
	// even when SQS hands some out twice. A receive whose answer was lost
	// (the SDK retried it) hides its messages for its visibility: while the
	// queue hides more than the lease holds, the call waits.
	hold := !look
	seen := map[string]bool{}
	strays := time.Time{}
	for got, empties, calls := 0, 0, 0; got < parked && calls < 2*parked+1+maxEmptyReceives; calls++ {
		if empties >= maxEmptyReceives {
			if strays.IsZero() {
				strays = time.Now().Add(browseVisibility + 5*time.Second)
			}
			held := 0
			for range l.receipts.Range {
				held++
			}
			hidden, err := s.count(ctx, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)
			if time.Now().After(strays) || err != nil || hidden <= held {
				break
			}
			empties, calls = 0, calls-1
		}
		vis := browseVisibility
		if !hold {
			vis = lookVisibility
		}
		out, err := s.cl.ReceiveMessage(ctx, receiveInput(s.dlq.url, 10, time.Second, vis))
		if err != nil {
			return fmt.Errorf("sqs: dead-letter queue %s: receive: %w", s.dlq.name, err)
		}
		if len(out.Messages) == 0 {
			empties++
			continue
		}
		empties = 0
		var fresh []*types.Message
		var ps []*driver.Parked
		hs := make([]*string, len(out.Messages))
		for i := range out.Messages {
			m := &out.Messages[i]
			if hs[i] = m.ReceiptHandle; hold {
				// Held before fn sees the first, so the heartbeat keeps
				// them hidden however long fn takes; one handed out again
				// replaces its receipt.
				l.receipts.Store(aws.ToString(m.MessageId), m.ReceiptHandle)
			}
			if id := aws.ToString(m.MessageId); !seen[id] {
				seen[id] = true
				fresh, ps = append(fresh, m), append(ps, s.parked(m))
			}
		}
		if !hold {
			if err := s.setAll(ctx, hs, 0); err != nil {
				return fmt.Errorf("sqs: dead-letter queue %s: making messages visible again after reading them (they come back within %v): %w", s.dlq.name, lookVisibility, err)
			}
			// SQS handed back only messages listed: hold from now on, so
			// that the next receives bring the others.
			hold = len(fresh) == 0
		}
		if got += len(fresh); len(fresh) > 0 {
			if err := fn(fresh, ps); err != nil {
				return err
			}
		}
	}
	return nil
}

// setAll sets the visibility of hs, messages of the dead-letter queue, to
// secs.
func (s *dlqStore) setAll(ctx context.Context, hs []*string, secs int32) error {
	errs, _ := inBatches(ctx, hs, 0, visibility(s.cl, s.dlq.url, hs, func(int) int32 { return secs }))
	return errors.Join(errs...)
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

// parked describes a received dead letter. One the redrive policy moved
// has no idemq-cause: its Cause says it passed maxReceiveCount, its
// Attempt is that count when it came from the consumer's own queue, and
// its ParkedAt the original's SentTimestamp.
func (s *dlqStore) parked(m *types.Message) *driver.Parked {
	headers, body := decode(m)
	sys := m.Attributes
	p := &driver.Parked{Ref: aws.ToString(m.MessageId), ID: headers[s.cfg.idAttribute], Key: sys[string(types.MessageSystemAttributeNameMessageGroupId)], Headers: headers, Body: body}
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
	return p
}

// errMoveUnsupported is moveAll's error when a move task does not apply.
var errMoveUnsupported = errors.New("sqs: no message move task for this dead-letter queue")

// moveAll asks SQS to move every message of the dead-letter queue back to
// its source queue and waits for the task to end. It returns
// errMoveUnsupported, having changed nothing, when the endpoint does not
// know move tasks or some parked message is a copy the policy did not move.
func (s *dlqStore) moveAll(ctx context.Context, progress func(int)) (int, error) {
	fail := func(what string, err error) error {
		return fmt.Errorf("sqs: redrive %s: %s: %w", s.dlq.name, what, err)
	}
	list := &awssqs.ListMessageMoveTasksInput{SourceArn: aws.String(s.dlq.arn), MaxResults: aws.Int32(10)}
	// Probe first: nothing is received if the endpoint says no.
	if _, err := s.cl.ListMessageMoveTasks(ctx, list); err != nil {
		if unsupported(err) {
			return 0, errMoveUnsupported
		}
		return 0, fail("listing move tasks", err)
	}
	seen, moved := 0, true
	err := s.browse(ctx, true, func(_ []*types.Message, ps []*driver.Parked) error {
		for _, p := range ps {
			_, copied := p.Headers[driver.CauseHeader]
			seen, moved = seen+1, moved && !copied
		}
		return nil
	})
	if err != nil || seen == 0 || !moved {
		return 0, errors.Join(cmp.Or(err, errMoveUnsupported), s.cur.release())
	}
	if err := s.cur.release(); err != nil {
		return 0, fail("making the messages visible for the move task", err)
	}
	out, err := s.cl.StartMessageMoveTask(ctx, &awssqs.StartMessageMoveTaskInput{SourceArn: aws.String(s.dlq.arn)})
	if err != nil {
		return 0, fail("starting a move task", err)
	}
	for done := 0; ; {
		tasks, err := s.cl.ListMessageMoveTasks(ctx, list)
		if err != nil {
			return done, fail("watching the move task", err)
		}
		for _, t := range tasks.Results {
			if aws.ToString(t.TaskHandle) != aws.ToString(out.TaskHandle) {
				continue
			}
			for ; int64(done) < t.ApproximateNumberOfMessagesMoved; done++ {
				if progress != nil {
					progress(done + 1)
				}
			}
			switch status := aws.ToString(t.Status); status {
			case "COMPLETED":
				return done, nil
			case "FAILED", "CANCELLED":
				return done, fail("move task "+status, errors.New(aws.ToString(t.FailureReason)))
			}
		}
		if !retry.Sleep(ctx, time.Second) {
			return done, ctx.Err()
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

// lease keeps the messages a call holds hidden (a heartbeat) until it
// releases them.
type lease struct {
	s        *dlqStore
	receipts sync.Map // receipt handle by MessageId
	stop     context.CancelFunc
	done     sync.WaitGroup
	once     sync.Once
}

func newLease(s *dlqStore) *lease {
	run, stop := context.WithCancel(context.Background())
	l := &lease{s: s, stop: stop}
	l.done.Go(func() {
		retry.Every(run, browseVisibility/3, func(time.Time) {
			ctx, cancel := context.WithTimeout(run, browseVisibility/3)
			defer cancel()
			if err := l.setVisibility(ctx, int32(browseVisibility/time.Second)); err != nil && run.Err() == nil {
				cmp.Or(s.cfg.logger, slog.Default()).Warn("idemq sqs: extending the visibility of dead letters being browsed failed; they may show up twice", "queue", s.dlq.name, "error", err)
			}
		})
	})
	return l
}

// release stops the heartbeat and makes the messages held visible again;
// once.
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
		l.receipts.Clear()
	})
	return err
}

// setVisibility sets the visibility of every held message to secs.
func (l *lease) setVisibility(ctx context.Context, secs int32) error {
	var hs []*string
	for _, h := range l.receipts.Range {
		hs = append(hs, h.(*string))
	}
	return l.s.setAll(ctx, hs, secs)
}
