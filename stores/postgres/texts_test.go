package postgres

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemq/idemq/internal/servicetest"
)

// TestTextsInEveryExecMode sends texts as the claim statements do, in each
// of pgx's query modes a user can choose in the URL
// (default_query_exec_mode), and reads back what the server got.
func TestTextsInEveryExecMode(t *testing.T) {
	url := servicetest.PostgresURL(t)
	in := []string{"a", "", `quo"te`, "back\\slash", "comma,brace{}", "NULL", "ünïcode", "space s"}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var out []string
			if err := conn.QueryRow(ctx, `SELECT array_agg(u.v ORDER BY u.o) FROM unnest($1::text[]) WITH ORDINALITY AS u(v, o)`, mode, texts(in)).Scan(&out); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(out, in) {
				t.Fatalf("sent %q, the server read %q", in, out)
			}
			var isNull bool
			if err := conn.QueryRow(ctx, `SELECT $1::text[] IS NULL`, mode, texts(nil)).Scan(&isNull); err != nil {
				t.Fatal(err)
			}
			if !isNull {
				t.Fatal("a nil texts is not NULL")
			}
		})
	}
}

// BenchmarkTextsEncode compares texts with a []string as a claim's ids.
func BenchmarkTextsEncode(b *testing.B) {
	ids := make([]string, 200)
	for i := range ids {
		ids[i] = "payment-0000000000" + string(rune('a'+i%26))
	}
	for _, c := range []struct {
		name string
		arg  any
	}{{"strings", ids}, {"texts", texts(ids)}} {
		b.Run(c.name, func(b *testing.B) {
			tm := pgtype.NewMap()
			plan := tm.PlanEncode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, c.arg)
			if plan == nil {
				b.Fatal("no plan")
			}
			buf := make([]byte, 0, 8192)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := plan.Encode(c.arg, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
