package sqs

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// AttributeFolded holds, as one JSON object ({"name":{"DataType":"String",
// "StringValue":"…"}, …}, binary values in base64 under "BinaryValue"),
// the attributes of a parked copy that did not fit beside the bookkeeping
// (SQS allows ten). A Source unfolds it on receive.
const AttributeFolded = "idemq-attributes"

// maxAttributes is SQS's limit of message attributes per message.
const maxAttributes = 10

// foldedValue is one folded attribute.
type foldedValue struct {
	DataType    string  `json:"DataType"`
	StringValue *string `json:"StringValue,omitempty"`
	BinaryValue []byte  `json:"BinaryValue,omitempty"`
}

// unfold returns a copy of attrs with the attributes folded into
// AttributeFolded restored beside the others (an attribute present
// outside the fold wins). A fold that is not valid JSON is kept as it is.
func unfold(attrs map[string]types.MessageAttributeValue) map[string]types.MessageAttributeValue {
	out := make(map[string]types.MessageAttributeValue, len(attrs)+maxAttributes)
	maps.Copy(out, attrs)
	var folded map[string]foldedValue
	if f, ok := attrs[AttributeFolded]; !ok || f.StringValue == nil || json.Unmarshal([]byte(*f.StringValue), &folded) != nil {
		return out
	}
	delete(out, AttributeFolded)
	for k, v := range folded {
		if _, ok := out[k]; !ok {
			out[k] = types.MessageAttributeValue{DataType: aws.String(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
		}
	}
	return out
}

// fold keeps attrs within SQS's ten attributes: when there are more, the
// pinned ones (in their order) and then the others by name stay as they
// are up to nine, and the rest go into AttributeFolded. Nothing is lost.
func fold(attrs map[string]types.MessageAttributeValue, pinned ...string) map[string]types.MessageAttributeValue {
	if len(attrs) <= maxAttributes {
		return attrs
	}
	var names, rest []string
	for _, k := range pinned {
		if _, ok := attrs[k]; ok && !slices.Contains(names, k) {
			names = append(names, k)
		}
	}
	for k := range attrs {
		if !slices.Contains(pinned, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	out := make(map[string]types.MessageAttributeValue, maxAttributes)
	folded := make(map[string]foldedValue, len(attrs))
	for i, k := range append(names, rest...) {
		if v := attrs[k]; i < maxAttributes-1 {
			out[k] = v
		} else {
			folded[k] = foldedValue{DataType: aws.ToString(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
		}
	}
	b, _ := json.Marshal(folded) // strings and bytes: it cannot fail
	out[AttributeFolded] = stringAttr(string(b))
	return out
}
