package rabbitmq

import (
	"fmt"
	"math"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestRenderHeadersNumbers checks that numbers and booleans render as
// fmt.Sprint renders them (renderHeaders uses strconv for speed).
func TestRenderHeadersNumbers(t *testing.T) {
	vals := []any{
		int(math.MinInt64), int(-1), int(0), int(math.MaxInt64),
		int8(math.MinInt8), int8(math.MaxInt8), int16(math.MinInt16), int16(math.MaxInt16),
		int32(math.MinInt32), int32(math.MaxInt32), int64(math.MinInt64), int64(math.MaxInt64),
		uint8(math.MaxUint8), uint16(math.MaxUint16), uint32(math.MaxUint32), uint64(math.MaxUint64),
		true, false, float32(1.5), float64(-2.25), amqp.Decimal{Scale: 2, Value: 12345},
	}
	for _, v := range vals {
		got := renderHeaders(amqp.Table{"h": v})["h"]
		if want := fmt.Sprint(v); got != want {
			t.Errorf("%T %v: rendered %q, want %q", v, v, got, want)
		}
	}
}
