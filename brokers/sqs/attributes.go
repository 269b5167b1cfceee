package sqs

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// AttributeFolded holds, as one JSON object, the message attributes of a
// dead-lettered copy that did not fit beside the dead-letter attributes
// (SQS allows ten per message): {"name":{"DataType":"String",
// "StringValue":"…"}, …}, binary values in base64 under "BinaryValue". The
// cause, the id attribute, idemq-encoding and traceparent are never
// folded. The Source unfolds it on receive, so a message redriven from the
// dead-letter queue has all its attributes back as headers.
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
	for k, v := range attrs {
		out[k] = v
	}
	f, ok := attrs[AttributeFolded]
	if !ok || f.StringValue == nil {
		return out
	}
	var folded map[string]foldedValue
	if err := json.Unmarshal([]byte(*f.StringValue), &folded); err != nil {
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
func fold(attrs map[string]types.MessageAttributeValue, pinned ...string) (map[string]types.MessageAttributeValue, error) {
	if len(attrs) <= maxAttributes {
		return attrs, nil
	}
	names := make([]string, 0, len(attrs))
	for k := range attrs {
		if !slices.Contains(pinned, k) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for i := len(pinned) - 1; i >= 0; i-- {
		if _, ok := attrs[pinned[i]]; ok {
			names = slices.Insert(names, 0, pinned[i])
		}
	}
	out := make(map[string]types.MessageAttributeValue, maxAttributes)
	folded := make(map[string]foldedValue, len(names))
	for i, k := range names {
		v := attrs[k]
		if i < maxAttributes-1 {
			out[k] = v
			continue
		}
		folded[k] = foldedValue{DataType: aws.ToString(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
	}
	b, err := json.Marshal(folded)
	if err != nil {
		return nil, fmt.Errorf("folding %d attributes into %s: %w", len(folded), AttributeFolded, err)
	}
	out[AttributeFolded] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(string(b))}
	return out, nil
}
