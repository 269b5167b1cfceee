package sqloutbox

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idemq/idemq/outbox"
)

func TestAppendRuns(t *testing.T) {
	heads := []*outbox.Row{{Seq: 3, Key: "a"}, {Seq: 5}, {Seq: 7, Key: "b"}}
	var asked string
	got, err := AppendRuns(heads, 6, func(keys []string, seqs []int64, room int) ([]*outbox.Row, error) {
		asked = fmt.Sprint(keys, seqs, room)
		// Seq 1 of key a is older than its head: never appended.
		return []*outbox.Row{{Seq: 1, Key: "a"}, {Seq: 4, Key: "a"}, {Seq: 8, Key: "b"}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if asked != "[a b] [3 5 7] 3" {
		t.Errorf("run asked for %s", asked)
	}
	var seqs []int64
	for _, r := range got {
		seqs = append(seqs, r.Seq)
	}
	if fmt.Sprint(seqs) != "[3 4 5 7 8]" {
		t.Errorf("rows %v, want [3 4 5 7 8]", seqs)
	}
	never := func([]string, []int64, int) ([]*outbox.Row, error) { return nil, errors.New("called") }
	if got, err := AppendRuns(heads, 3, never); err != nil || len(got) != 3 {
		t.Errorf("no room: %d rows, %v", len(got), err)
	}
	if got, err := AppendRuns([]*outbox.Row{{Seq: 1}}, 5, never); err != nil || len(got) != 1 {
		t.Errorf("no keys: %d rows, %v", len(got), err)
	}
}

func TestPrepareAndLockKeys(t *testing.T) {
	msgs := []*outbox.Message{{Destination: "d", Key: "b"}, {Destination: "d", Key: "a", Body: []byte("x")}, {Destination: "d", Key: "b"}, {Destination: "d"}}
	rows, err := Prepare(context.Background(), "st", false, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		if r.ID == "" || r.Body == nil || r.Headers == "" {
			t.Errorf("row %d not ready: %+v", i, r)
		}
	}
	if got := LockKeys(rows, func(k string) string { return k + "!" }); fmt.Sprint(got) != "[a! b!]" {
		t.Errorf("locks %v, want [a! b!]", got)
	}
	if _, err := Prepare(context.Background(), "st", false, []*outbox.Message{nil}); err == nil {
		t.Error("nil message accepted")
	}
	if _, err := Prepare(context.Background(), "st", true, nil); err == nil || err.Error() != "st: Write: nil tx" {
		t.Errorf("no tx: %v", err)
	}
	if rows, err := Prepare(context.Background(), "st", false, nil); err != nil || rows != nil {
		t.Errorf("no messages: %v, %v", rows, err)
	}
}
