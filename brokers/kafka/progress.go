package kafka

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Kafka commits one offset per partition, so a message decided behind an
// undecided one would come back to the partition's next owner. The commit
// metadata therefore also says which offsets above the committed one are
// decided, and the highest offset handed out: the next owner skips the
// former and hands the others out with Attempt ≥ 2. It is advisory: lost or
// cut short, those messages are redelivered and decided Duplicate.
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
// bytes, leaving out those that do not fit; false: some did not.
func encodeSpans(committed, high int64, spans []span, limit int) (string, bool) {
	md := append(make([]byte, 0, 64), progressPrefix+"h="...)
	if high >= committed {
		md = strconv.AppendInt(md, high-committed, 36)
	} else {
		md = append(md, '-')
	}
	md = append(md, ";d="...)
	for i, s := range dropBelow(spans, committed) {
		n := len(md)
		if i > 0 {
			md = append(md, ',')
		}
		md = strconv.AppendInt(append(strconv.AppendInt(md, s.start-committed, 36), '+'), s.count, 36)
		if len(md)+1-min(i, 1) > limit { // a separator's room is kept for the first item too
			return string(md[:n]), false
		}
	}
	return string(md), true
}

// decodeProgress parses metadata written by encodeProgress for the given
// committed offset. Metadata from other clients yields nothing.
func decodeProgress(committed int64, md string) (high int64, spans []span, err error) {
	if !strings.HasPrefix(md, progressPrefix) || committed < 0 {
		return -1, nil, nil
	}
	high = -1
	for _, field := range strings.Split(md[len(progressPrefix):], ";") {
		k, v, _ := strings.Cut(field, "=")
		if k == "h" && v != "-" && v != "" {
			n, err := strconv.ParseInt(v, 36, 64)
			if err != nil {
				return -1, nil, fmt.Errorf("high %q: %w", v, err)
			}
			high = committed + n
		}
		if k != "d" || v == "" {
			continue
		}
		for _, item := range strings.Split(v, ",") {
			a, c, _ := strings.Cut(item, "+")
			s, err1 := strconv.ParseInt(a, 36, 64)
			n, err2 := strconv.ParseInt(c, 36, 64)
			if err1 != nil || err2 != nil || s < 0 || n < 1 {
				return -1, nil, fmt.Errorf("span %q", item)
			}
			spans = append(spans, span{committed + s, n})
		}
	}
	return high, spans, nil
}

// covered reports whether offset lies in one of spans (sorted, disjoint).
func covered(spans []span, offset int64) bool {
	_, found := slices.BinarySearchFunc(spans, offset, cmpSpan)
	return found
}

// cmpSpan orders s against offset o: below it, holding it, or above it.
func cmpSpan(s span, o int64) int {
	switch {
	case s.end() <= o:
		return -1
	case s.start > o:
		return 1
	}
	return 0
}

// dropBelow cuts spans (sorted) to the offsets from point up.
func dropBelow(spans []span, point int64) []span {
	var out []span
	for _, s := range spans {
		if start := max(s.start, point); s.end() > point {
			out = append(out, span{start, s.end() - start})
		}
	}
	return out
}

// addSpan adds offset to spans (sorted, disjoint), merging neighbours.
func addSpan(spans []span, offset int64) []span {
	i, found := slices.BinarySearchFunc(spans, offset, cmpSpan)
	out := slices.Clone(spans)
	if found {
		return out
	}
	out = slices.Insert(out, i, span{offset, 1})
	if i+1 < len(out) && out[i].end() == out[i+1].start {
		out[i].count += out[i+1].count
		out = slices.Delete(out, i+1, i+2)
	}
	if i > 0 && out[i-1].end() == out[i].start {
		out[i-1].count += out[i].count
		out = slices.Delete(out, i, i+1)
	}
	return out
}
