package story

import (
	"bytes"
	"strings"
	"testing"
)

// An excerpt is short and printable whatever the answer's bytes.
func TestExcerpt(t *testing.T) {
	if got := excerpt([]byte("{\"a\":\x00\xff}\n")); got != `{"a":\x00\xff}\x0a` {
		t.Errorf("excerpt = %q", got)
	}
	long := excerpt(bytes.Repeat([]byte("é"), 200))
	if !strings.HasSuffix(long, "…") || strings.Count(long, "é") != excerptBytes/2 {
		t.Errorf("long excerpt = %q", long)
	}
}

// An answer's shape keeps its keys, numbers and nesting and none of its
// words: not a string, not a key that is not a plain name.
func TestShapeHidesEveryWord(t *testing.T) {
	const secret = "CUSTOMER-SECRET-hunter2"
	raw := []byte(`{"findings":[{"file":"config/db.go","line":12,"summary":"` + secret + `","blocking":true}],` +
		`"` + secret + `":1,"note":null}`)
	got := shape(raw)
	want := `{"findings":[{"blocking":true,"file":"‹12 chars›","line":12,"summary":"‹23 chars›"}],"note":null,"‹key of 23 chars›":1}`
	if got != want {
		t.Errorf("shape = %s\nwant    %s", got, want)
	}
	if strings.Contains(got, "hunter2") || strings.Contains(got, "config") {
		t.Errorf("the shape shows the answer's words: %s", got)
	}
	if got := shape([]byte("Sure! Here is the JSON: {")); got != "(not JSON: 25 bytes)" {
		t.Errorf("not JSON: %q", got)
	}
	big := shape([]byte(`{"a":[` + strings.Repeat(`1,`, 3000) + `1]}`))
	if !strings.HasSuffix(big, "…") || len(big) > shapeBytes+len("…") {
		t.Errorf("a long shape is %d bytes", len(big))
	}
}
