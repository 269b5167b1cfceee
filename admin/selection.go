package admin

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Selection chooses dead letters by what an operator knows of them. The
// idemq command's filters and the console's are this one type, so the two
// choose alike. The zero Selection chooses every message; each field set
// narrows it.
type Selection struct {
	// IDs chooses the messages with one of these business ids.
	IDs []string
	// Refs chooses the parked copies with one of these refs
	// (Parked.Ref): how to choose a message that has no id.
	Refs []string
	// Cause chooses the messages whose cause holds this text, in any
	// case.
	Cause string
	// Group chooses the messages whose cause falls in this cause group
	// (CauseGroup).
	Group string
	// OlderThan chooses the messages parked at least this long ago,
	// NewerThan those parked less than this long ago; 0 sets no bound.
	OlderThan, NewerThan time.Duration
}

// Check reports a Selection no message can be held against: a negative
// age, named by its field.
func (s Selection) Check() error {
	switch {
	case s.OlderThan < 0:
		return fmt.Errorf("Selection.OlderThan %v is negative", s.OlderThan)
	case s.NewerThan < 0:
		return fmt.Errorf("Selection.NewerThan %v is negative", s.NewerThan)
	}
	return nil
}

// Narrowed reports whether any field is set: whether s chooses less than
// every message.
func (s Selection) Narrowed() bool {
	return len(s.IDs) > 0 || len(s.Refs) > 0 || s.Cause != "" || s.Group != "" || s.OlderThan > 0 || s.NewerThan > 0
}

// Match reports whether s chooses p at now.
func (s Selection) Match(p *Parked, now time.Time) bool {
	age := now.Sub(p.ParkedAt)
	switch {
	case len(s.IDs) > 0 && !slices.Contains(s.IDs, p.ID),
		len(s.Refs) > 0 && !slices.Contains(s.Refs, p.Ref),
		s.Cause != "" && !strings.Contains(strings.ToLower(p.Cause), strings.ToLower(s.Cause)),
		s.OlderThan > 0 && age < s.OlderThan,
		s.NewerThan > 0 && age >= s.NewerThan,
		s.Group != "" && CauseGroup(p) != s.Group:
		return false
	}
	return true
}

// RedriveGuard says which chosen dead letters a redrive may put back. A
// redriven message whose id was applied meanwhile (another copy, a
// producer's retry) is decided Duplicate only while its claim exists: one
// parked longer ago than the store keeps claims may have a twin whose
// claim was pruned, and would be applied twice.
type RedriveGuard struct {
	// Retention is how long the consumer's store keeps claims; 0 when it
	// is not known, which refuses every message unless Force.
	Retention time.Duration
	// Force redrives what Retention refuses: for messages the operator
	// knows were not applied.
	Force bool
}

// RedriveGuard returns the guard of a redrive into the consumer whose
// claims s keeps: its retention, and force.
func (s *Store) RedriveGuard(force bool) RedriveGuard {
	ret, _ := s.Retention()
	return RedriveGuard{Retention: ret, Force: force}
}

// Refuses reports whether g keeps p parked at now.
func (g RedriveGuard) Refuses(p *Parked, now time.Time) bool {
	return !g.Force && (g.Retention <= 0 || now.Sub(p.ParkedAt) > g.Retention)
}

// RedriveSelected redrives the dead letters of q that sel chooses at now,
// apart from those g refuses, in one Redrive (progress is
// its). It returns how many it redrove and how many g refused; after an
// error, those were redriven and the rest are still parked.
func RedriveSelected(ctx context.Context, q DeadLetterQueue, sel Selection, g RedriveGuard, now time.Time, progress func(done int)) (redriven, refused int, err error) {
	redriven, err = Redrive(ctx, q, func(p *Parked) bool {
		if !sel.Match(p, now) {
			return false
		}
		if g.Refuses(p, now) {
			refused++
			return false
		}
		return true
	}, progress)
	return redriven, refused, err
}

// PurgeSelected deletes the dead letters of q that sel chooses at now and
// returns how many.
func PurgeSelected(ctx context.Context, q DeadLetterQueue, sel Selection, now time.Time) (int, error) {
	return q.Purge(ctx, func(p *Parked) bool { return sel.Match(p, now) })
}

// Cause grouping: the parts of a cause that vary from message to message,
// masked in this order.
var (
	causeQuoted  = regexp.MustCompile(`"[^"]*"|'[^']*'`)
	causeUUID    = regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`)
	causeDecimal = regexp.MustCompile(`\bv?\d+(?:\.\d+)+[a-zµ]{0,3}\b`) // 1.5s, 10.0.0.1, v2.0.1
	causeWord    = regexp.MustCompile(`[\p{L}\p{N}]+(?:[-_][\p{L}\p{N}]+)*`)
)

// causeNames are words with digits that name a thing, not an instance of
// it: CauseGroup keeps them.
var causeNames = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`utf8 utf16 utf32 base32 base58 base64 md5 sha1 sha224 sha256 sha384 sha512 crc32 crc64
		int8 int16 int32 int64 uint8 uint16 uint32 uint64 float32 float64 http1 http2 http3 h2 h2c ipv4 ipv6 x509 pkcs1 pkcs8 pkcs12
		tls1 tls12 tls13 s3 ec2 1xx 2xx 3xx 4xx 5xx`) {
		causeNames[w] = true
	}
}

// maxGroupLen bounds a cause group's length in bytes.
const maxGroupLen = 300

// CauseGroup is the group of p's cause: the cause with what varies from
// message to message replaced by "…", so that dead letters parked for the
// same reason fall in one group. It masks quoted text, UUIDs, p's own id
// wherever it stands, and every word (letters and digits, joined by '-'
// or '_') that holds a digit: numbers, numbers with units, hex, and ids
// mixing letters and digits such as ord7x or ch_3PqRsTuVwXyZ (unless the
// digits are only in the names of things such as utf8, sha256, int64 or
// 5xx); and a word of the form prefix_Tail whose tail is long and mixes
// cases, as random ids without a digit do. "(no cause)" when p has none.
func CauseGroup(p *Parked) string {
	g := causeQuoted.ReplaceAllString(p.Cause, "…")
	g = causeUUID.ReplaceAllString(g, "…")
	g = maskID(g, p.ID)
	g = causeDecimal.ReplaceAllString(g, "…")
	g = causeWord.ReplaceAllStringFunc(g, func(w string) string {
		if idLike(w) {
			return "…"
		}
		return w
	})
	if len(g) > maxGroupLen {
		g = g[:maxGroupLen]
		for !utf8.ValidString(g) {
			g = g[:len(g)-1]
		}
	}
	if g == "" {
		return "(no cause)"
	}
	return g
}

// maskID replaces each occurrence of id in s that is not part of a longer
// word with "…". Ids under 3 bytes are left: they would match ordinary
// text, and a number is masked anyway.
func maskID(s, id string) string {
	if len(id) < 3 {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, id)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		before, _ := utf8.DecodeLastRuneInString(s[:i])
		after, _ := utf8.DecodeRuneInString(s[i+len(id):])
		if (i > 0 && wordRune(before)) || (i+len(id) < len(s) && wordRune(after)) {
			b.WriteString(s[:i+1])
			s = s[i+1:]
			continue
		}
		b.WriteString(s[:i])
		b.WriteString("…")
		s = s[i+len(id):]
	}
}

// wordRune reports whether r can be part of a word causeWord matches.
func wordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsNumber(r) || r == '-' || r == '_'
}

// idLike reports whether the word w reads as an instance's id rather than
// as text.
func idLike(w string) bool {
	for _, piece := range strings.FieldsFunc(w, func(r rune) bool { return r == '-' || r == '_' }) {
		if strings.IndexFunc(piece, unicode.IsDigit) >= 0 && !causeNames[strings.ToLower(piece)] {
			return true
		}
	}
	// prefix_Tail: a random tail long enough that it holds no digit only
	// by chance mixes upper and lower case after its first letter.
	i := strings.LastIndexByte(w, '_')
	if i < 0 {
		return false
	}
	tail := w[i+1:]
	_, first := utf8.DecodeRuneInString(tail)
	return len(tail) >= 10 && strings.IndexFunc(tail[first:], unicode.IsUpper) >= 0 && strings.IndexFunc(tail, unicode.IsLower) >= 0
}

// DeadLetterGroup is the dead letters of one cause group, as a Grouper
// counts them.
type DeadLetterGroup struct {
	// Key is the cause group (CauseGroup).
	Key string
	// Count is how many dead letters the group holds.
	Count int
	// Oldest and Newest are when its first and last were parked.
	Oldest, Newest time.Time
	// Parked are its first dead letters added, at most the Grouper's
	// keep.
	Parked []*Parked
}

// Grouper groups dead letters by cause (CauseGroup) as a scan reads them.
// It is not safe for concurrent use.
type Grouper struct {
	keep   int
	byKey  map[string]*DeadLetterGroup
	groups []*DeadLetterGroup
}

// NewGrouper returns a Grouper that keeps the first keep dead letters of
// each group (DeadLetterGroup.Parked).
func NewGrouper(keep int) *Grouper {
	return &Grouper{keep: keep, byKey: map[string]*DeadLetterGroup{}}
}

// Add counts p in its group, and keeps p itself among the group's first.
func (g *Grouper) Add(p *Parked) {
	k := CauseGroup(p)
	grp := g.byKey[k]
	if grp == nil {
		grp = &DeadLetterGroup{Key: k, Oldest: p.ParkedAt, Newest: p.ParkedAt}
		g.byKey[k] = grp
		g.groups = append(g.groups, grp)
	}
	grp.Count++
	if p.ParkedAt.Before(grp.Oldest) {
		grp.Oldest = p.ParkedAt
	}
	if p.ParkedAt.After(grp.Newest) {
		grp.Newest = p.ParkedAt
	}
	if len(grp.Parked) < g.keep {
		grp.Parked = append(grp.Parked, p)
	}
}

// Groups returns the groups, the largest first, then by key.
func (g *Grouper) Groups() []*DeadLetterGroup {
	out := slices.Clone(g.groups)
	slices.SortStableFunc(out, func(a, b *DeadLetterGroup) int { return cmp.Or(b.Count-a.Count, strings.Compare(a.Key, b.Key)) })
	return out
}
