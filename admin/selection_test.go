package admin

import (
	"strings"
	"testing"
	"time"
)

// Causes that differ only in what varies from message to message fall in
// one group; causes that differ in words do not.
func TestCauseGroup(t *testing.T) {
	same := []struct {
		name  string
		a, b  Parked
		group string
	}{
		{"numbers", Parked{Cause: "insufficient funds for account 1001"}, Parked{Cause: "insufficient funds for account 2002"},
			"insufficient funds for account …"},
		{"quoted values", Parked{Cause: `schema: unknown field "coupon"`}, Parked{Cause: `schema: unknown field "voucher"`},
			"schema: unknown field …"},
		{"durations", Parked{Cause: "ledger timeout after 30s"}, Parked{Cause: "ledger timeout after 1.5s"}, "ledger timeout after …"},
		{"UUIDs", Parked{Cause: "row 0b6f1a52-8b0e-4f4c-9f55-6c1d2e3f4a5b is locked"}, Parked{Cause: "row 7e5d7c1b-1b2c-4d3e-8f9a-0a1b2c3d4e5f is locked"},
			"row … is locked"},
		{"the message's own id", Parked{ID: "ord-alpha", Cause: "order ord-alpha: stock reservation failed"},
			Parked{ID: "ord-beta", Cause: "order ord-beta: stock reservation failed"}, "order …: stock reservation failed"},
		{"the own id quoted and bare", Parked{ID: "ord-alpha", Cause: `idemq: message "ord-alpha": handler: order ord-alpha held`},
			Parked{ID: "ord-beta", Cause: `idemq: message "ord-beta": handler: order ord-beta held`}, "idemq: message …: handler: order … held"},
		{"Stripe ids", Parked{Cause: "stripe: charge ch_3PqRsTuVwXyZ12 failed: card_declined"},
			Parked{Cause: "stripe: charge ch_9AbCdEfGhIjK34 failed: card_declined"}, "stripe: charge … failed: card_declined"},
		{"prefix_ ids without a digit", Parked{Cause: "customer cus_NffrFeUfNVwHib not found"}, Parked{Cause: "customer cus_QpRsTuvWxyzAb not found"},
			"customer … not found"},
		{"letters and digits mixed", Parked{Cause: "sku A7X9QZ out of stock"}, Parked{Cause: "sku B2C4DD out of stock"}, "sku … out of stock"},
		{"ids with a number part", Parked{Cause: "refund of pay-17 refused"}, Parked{Cause: "refund of pay-903 refused"}, "refund of … refused"},
		{"hex", Parked{Cause: "object 9f2c01ab missing"}, Parked{Cause: "object 33dd4e01 missing"}, "object … missing"},
		{"addresses and versions", Parked{Cause: "dial 10.0.0.1:5432 refused by v2.0.1"}, Parked{Cause: "dial 10.0.0.7:5433 refused by v2.0.3"},
			"dial …:… refused by …"},
	}
	for _, c := range same {
		ga, gb := CauseGroup(&c.a), CauseGroup(&c.b)
		if ga != gb || ga != c.group {
			t.Errorf("%s: groups %q and %q, want both %q", c.name, ga, gb, c.group)
		}
	}
	apart := []struct {
		name string
		a, b Parked
	}{
		{"different words", Parked{Cause: "card declined: code 51"}, Parked{Cause: "ledger timeout after 30s"}},
		{"names of things kept", Parked{Cause: "body is not utf8"}, Parked{Cause: "body is not base64"}},
		{"status classes kept", Parked{Cause: "upstream answered 4xx"}, Parked{Cause: "upstream answered 5xx"}},
		{"names inside words kept", Parked{Cause: "field is utf8-encoded"}, Parked{Cause: "field is base64-encoded"}},
		{"snake_case words kept", Parked{Cause: "max_attempts reached"}, Parked{Cause: "max_delay reached"}},
		{"an id that is part of a word", Parked{ID: "pay", Cause: "payment refused"}, Parked{ID: "pay", Cause: "repayment refused"}},
	}
	for _, c := range apart {
		if ga, gb := CauseGroup(&c.a), CauseGroup(&c.b); ga == gb {
			t.Errorf("%s: %q and %q both in group %q", c.name, c.a.Cause, c.b.Cause, ga)
		}
	}
	if g := CauseGroup(&Parked{ID: "pay", Cause: "payment refused"}); g != "payment refused" {
		t.Errorf("an id inside a word is masked: %q", g)
	}
	if g := CauseGroup(&Parked{}); g != "(no cause)" {
		t.Errorf("no cause: %q", g)
	}
	long := CauseGroup(&Parked{Cause: strings.Repeat("é", 400)})
	if len(long) > maxGroupLen || !strings.HasPrefix(long, "éé") || strings.ContainsRune(long, '\uFFFD') {
		t.Errorf("a long cause's group is %d bytes: %q", len(long), long[:20])
	}
}

// What a Selection chooses, each field alone and together.
func TestSelection(t *testing.T) {
	now := time.Now()
	msgs := []*Parked{
		{Ref: "r1", ID: "a", Cause: "card declined: code 51", ParkedAt: now.Add(-2 * time.Hour)},
		{Ref: "r2", ID: "b", Cause: "card declined: code 05", ParkedAt: now.Add(-10 * time.Minute)},
		{Ref: "r3", ID: "c", Cause: "ledger timeout after 30s", ParkedAt: now.Add(-time.Minute)},
		{Ref: "r4", ID: "a", Cause: "ledger timeout after 31s", ParkedAt: now.Add(-25 * time.Hour)},
	}
	for _, c := range []struct {
		sel  Selection
		want string
	}{
		{Selection{}, "r1 r2 r3 r4"},
		{Selection{IDs: []string{"a", "c"}}, "r1 r3 r4"},
		{Selection{Refs: []string{"r2"}}, "r2"},
		{Selection{Cause: "CARD DECLINED"}, "r1 r2"},
		{Selection{Group: "ledger timeout after …"}, "r3 r4"},
		{Selection{OlderThan: time.Hour}, "r1 r4"},
		{Selection{NewerThan: time.Hour}, "r2 r3"},
		{Selection{OlderThan: time.Hour, NewerThan: 24 * time.Hour}, "r1"},
		{Selection{IDs: []string{"a"}, Group: "ledger timeout after …"}, "r4"},
	} {
		var got []string
		for _, p := range msgs {
			if c.sel.Match(p, now) {
				got = append(got, p.Ref)
			}
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%+v chooses %q, want %q", c.sel, g, c.want)
		}
		if c.sel.Narrowed() != (c.want != "r1 r2 r3 r4") {
			t.Errorf("%+v: Narrowed() = %v", c.sel, c.sel.Narrowed())
		}
	}
	if err := (Selection{OlderThan: -1}).Check(); err == nil || !strings.Contains(err.Error(), "OlderThan") {
		t.Errorf("a negative OlderThan: %v", err)
	}
	if err := (Selection{NewerThan: -1}).Check(); err == nil || !strings.Contains(err.Error(), "NewerThan") {
		t.Errorf("a negative NewerThan: %v", err)
	}

	g := NewGrouper(1)
	for _, p := range msgs {
		g.Add(p)
	}
	groups := g.Groups()
	if len(groups) != 2 || groups[0].Key != "card declined: code …" || groups[1].Key != "ledger timeout after …" {
		t.Fatalf("groups %+v", groups)
	}
	for _, grp := range groups {
		if grp.Count != 2 || len(grp.Parked) != 1 || !grp.Oldest.Before(grp.Newest) {
			t.Errorf("group %q: %d messages, %d kept, oldest %v newest %v", grp.Key, grp.Count, len(grp.Parked), grp.Oldest, grp.Newest)
		}
	}
}

// A redrive refuses what was parked longer ago than the claims are kept,
// everything when that is unknown, and nothing when forced.
func TestRedriveGuard(t *testing.T) {
	now := time.Now()
	young, old := &Parked{ParkedAt: now.Add(-time.Hour)}, &Parked{ParkedAt: now.Add(-48 * time.Hour)}
	for _, c := range []struct {
		g                   RedriveGuard
		refuseYoung, refOld bool
	}{
		{RedriveGuard{Retention: 24 * time.Hour}, false, true},
		{RedriveGuard{Retention: 24 * time.Hour, Force: true}, false, false},
		{RedriveGuard{}, true, true},
		{RedriveGuard{Force: true}, false, false},
	} {
		if c.g.Refuses(young, now) != c.refuseYoung || c.g.Refuses(old, now) != c.refOld {
			t.Errorf("%+v refuses a message parked an hour ago: %v, two days ago: %v; want %v, %v",
				c.g, c.g.Refuses(young, now), c.g.Refuses(old, now), c.refuseYoung, c.refOld)
		}
	}
}
