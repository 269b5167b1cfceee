package postgres

import (
	"database/sql/driver"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// texts is a text[] argument that pgx encodes without an allocation per
// element: a []string goes through pgtype.FlatArray, whose Index boxes each
// string in an interface, twice a claimed message on the claim path.
type texts []string

// Dimensions implements pgtype.ArrayGetter; nil is SQL NULL, as for a nil
// []string.
func (a texts) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter: a textRef holds one pointer, so
// making it an interface allocates nothing.
func (a texts) Index(i int) any { return textRef{&a[i]} }

// IndexType implements pgtype.ArrayGetter.
func (a texts) IndexType() any { return textRef{} }

// Value implements driver.Valuer with the array's text form, which pgx
// sends where it does not know the parameter's type (the exec and simple
// protocol modes a URL's default_query_exec_mode can choose).
func (a texts) Value() (driver.Value, error) {
	if a == nil {
		return nil, nil
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range a {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, c := range []byte(s) {
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String(), nil
}

// textRef is one element of texts.
type textRef struct{ s *string }

// TextValue implements pgtype.TextValuer.
func (r textRef) TextValue() (pgtype.Text, error) { return pgtype.Text{String: *r.s, Valid: true}, nil }
