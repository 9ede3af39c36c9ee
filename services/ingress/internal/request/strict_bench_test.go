package request

import (
	"assay.dev/pkg/api"
	"fmt"
	"strings"
	"testing"
)

// The refused-batch attack's body: 3.5 MB, 200,000 keys no request has.
func attackBody() []byte {
	var b strings.Builder
	b.WriteString(`{"contract":"moderation","items":[{"itemId":"a","input":{"text":"x"}}],"x":{`)
	for i := range 200_000 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"key-%06d":"value"`, i)
	}
	b.WriteString(`}}`)
	return []byte(b.String())
}

// A batch as large as the API takes: 5,000 items of about 700 bytes.
func fullBatchBody() []byte {
	var b strings.Builder
	b.WriteString(`{"contract":"moderation","items":[`)
	text := strings.Repeat("a message of a long thread ", 25)
	for i := range api.MaxBatchItems {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"itemId":"item-%05d","input":{"text":%q}}`, i, text)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkDecodeStrict is the cost of reading a batch body: the attack's
// is refused at its first unknown key; a full valid batch is walked once
// and decoded.
func BenchmarkDecodeStrict(b *testing.B) {
	for _, c := range []struct {
		name string
		body []byte
	}{{"attack-3.5MB-200k-unknown-keys", attackBody()}, {"valid-5000-items", fullBatchBody()}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.body)))
			for b.Loop() {
				var req api.BatchRequest
				_ = Decode(c.body, &req)
			}
		})
	}
}
