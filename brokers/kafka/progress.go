package kafka

import (
	"fmt"
	"strconv"
	"strings"
)

// Kafka commits one offset per partition, so a message decided behind an
// undecided one would come back to the next owner of the partition. The
// Source therefore also writes, in the commit's metadata string, which
// offsets above the committed one are already decided, and the highest
// offset handed out. The next owner (this process or another) reads it
// when the partition is assigned: decided messages are skipped, and
// messages handed out before come back with Attempt ≥ 2. The metadata is
// advisory: if it is lost or cut short, those messages are redelivered and
// the dedup store decides Duplicate.
//
// Format: "idemq1;h=<high>;d=<start>+<count>,..." with every number in
// base 36, high and start relative to the committed offset.

const progressPrefix = "idemq1;"

// maxProgressBytes keeps the metadata under the brokers' default
// offset.metadata.max.bytes of 4096.
const maxProgressBytes = 3000

// span is a run of decided offsets [start, start+count).
type span struct{ start, count int64 }

func (s span) end() int64 { return s.start + s.count }

// encodeProgress renders high and the decided spans above committed;
// spans that do not fit are left out (their messages are redelivered).
func encodeProgress(committed, high int64, spans []span) string {
	md, _ := encodeSpans(committed, high, spans, maxProgressBytes)
	return md
}

// encodeSpans renders high and the spans above committed in at most limit
// bytes, leaving out the spans that do not fit; it reports whether every
// span fit.
func encodeSpans(committed, high int64, spans []span, limit int) (string, bool) {
	var b strings.Builder
	b.WriteString(progressPrefix)
	b.WriteString("h=")
	if high >= committed {
		b.WriteString(strconv.FormatInt(high-committed, 36))
	} else {
		b.WriteString("-")
	}
	b.WriteString(";d=")
	first := true
	for _, s := range spans {
		if s.end() <= committed {
			continue
		}
		start := max(s.start, committed)
		item := strconv.FormatInt(start-committed, 36) + "+" + strconv.FormatInt(s.end()-start, 36)
		if b.Len()+len(item)+1 > limit {
			return b.String(), false
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(item)
	}
	return b.String(), true
}

// decodeProgress parses metadata written by encodeProgress for the given
// committed offset. Metadata from other clients yields nothing.
func decodeProgress(committed int64, md string) (high int64, spans []span, err error) {
	high = -1
	if !strings.HasPrefix(md, progressPrefix) || committed < 0 {
		return high, nil, nil
	}
	for _, field := range strings.Split(md[len(progressPrefix):], ";") {
		k, v, _ := strings.Cut(field, "=")
		switch k {
		case "h":
			if v == "-" || v == "" {
				continue
			}
			n, err := strconv.ParseInt(v, 36, 64)
			if err != nil {
				return -1, nil, fmt.Errorf("high %q: %w", v, err)
			}
			high = committed + n
		case "d":
			if v == "" {
				continue
			}
			for _, item := range strings.Split(v, ",") {
				a, c, ok := strings.Cut(item, "+")
				if !ok {
					return -1, nil, fmt.Errorf("span %q", item)
				}
				s, err1 := strconv.ParseInt(a, 36, 64)
				n, err2 := strconv.ParseInt(c, 36, 64)
				if err1 != nil || err2 != nil || s < 0 || n < 1 {
					return -1, nil, fmt.Errorf("span %q", item)
				}
				spans = append(spans, span{committed + s, n})
			}
		}
	}
	return high, spans, nil
}

// covered reports whether offset lies in one of spans (sorted, disjoint).
func covered(spans []span, offset int64) bool {
	for _, s := range spans {
		if offset < s.start {
			return false
		}
		if offset < s.end() {
			return true
		}
	}
	return false
}

// dropBelow cuts spans (sorted) to the offsets from point up.
func dropBelow(spans []span, point int64) []span {
	var out []span
	for _, s := range spans {
		if s.end() <= point {
			continue
		}
		start := max(s.start, point)
		out = append(out, span{start, s.end() - start})
	}
	return out
}
