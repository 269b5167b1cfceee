package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idemq/idemq/core/driver"
)

// delivery is one entry handed out by a Source.
type delivery struct {
	s *Source
	e *entry
}

// Message implements driver.Delivery.
func (d *delivery) Message() *driver.Message { return d.e.D }

// IDError implements driver.IDErrorer: where the id was looked for.
func (d *delivery) IDError() error {
	if d.e.D.ID != "" {
		return nil
	}
	return fmt.Errorf("redis: entry %s of %s has no %s field, or an empty one (id_field= names the field that holds the id)", d.e.Key, d.s.stream, d.s.c.idField)
}

func (d *delivery) failed(what string, err error) error {
	return fmt.Errorf("redis: %s of entry %s of %s: %w", what, d.e.Key, d.s.stream, err)
}

// Ack implements driver.Delivery with XACK.
func (d *delivery) Ack(ctx context.Context) error {
	if err := d.s.settle(d.e); err != nil {
		return err
	}
	if err := d.s.rdb.XAck(ctx, d.s.stream, d.s.c.group, d.e.Key).Err(); err != nil {
		return d.failed("ack", err)
	}
	return nil
}

// Retry implements driver.Delivery. The entry stays pending: its idle time
// is set so that it reaches min_idle after delay (at most min_idle), and
// the group's next XAUTOCLAIM redelivers it with a higher delivery count.
func (d *delivery) Retry(ctx context.Context, delay time.Duration) error {
	if err := d.s.settle(d.e); err != nil {
		return err
	}
	if _, err := d.s.touch(ctx, max(d.s.c.minIdle-delay, 0), d.e.Key); err != nil {
		return d.failed("retry", err)
	}
	return nil
}

// DeadLetter implements driver.Delivery: in one MULTI/EXEC it adds the
// message (its fields, and the id a pipeline IDFunc gave it) with the
// cause, attempt, origin (stream/group/entry), parking time and
// destination to the dead-letter stream, and acknowledges the entry. If
// the transaction fails the entry stays pending and comes back.
func (d *delivery) DeadLetter(ctx context.Context, cause error) error {
	if err := d.s.settle(d.e); err != nil {
		return err
	}
	s, m := d.s, d.e.D
	why := "no cause given"
	if cause != nil {
		why = cause.Error()
	}
	values := append(s.fields(m.Headers, m.ID, m.Key, m.Body),
		driver.CauseHeader, why,
		driver.AttemptHeader, strconv.Itoa(m.Attempt),
		driver.OriginHeader, s.stream+"/"+s.c.group+"/"+d.e.Key,
		driver.ParkedAtHeader, time.Now().UTC().Format(time.RFC3339Nano),
		driver.DestinationHeader, s.stream)
	tx := s.rdb.TxPipeline()
	add := s.xadd(ctx, tx, s.c.dlq, values)
	ack := tx.XAck(ctx, s.stream, s.c.group, d.e.Key)
	if _, err := tx.Exec(ctx); err != nil {
		if add.Err() != nil && ack.Val() == 1 { // EXEC runs the XACK after a failed XADD
			err = fmt.Errorf("%w; the entry was acknowledged without its dead letter", err)
		}
		return d.failed("dead-letter to "+s.c.dlq, err)
	}
	return nil
}
