package classifier

import (
	"strings"
	"testing"
)

// The calls a review in parts makes at once: 8 unless set, 1 to 64, and a
// bad setting stops start-up naming it.
func TestPartConcurrencySetting(t *testing.T) {
	t.Parallel()
	c := Config{Region: "us", Model: "m"}
	if err := c.defaults(); err != nil || c.PartConcurrency != 8 {
		t.Fatalf("default: %d, %v; want 8", c.PartConcurrency, err)
	}
	for _, v := range []string{"0", "65", "four"} {
		var c Config
		err := c.FromEnv(func(k string) string {
			if k == "ASSAY_REVIEW_PART_CONCURRENCY" {
				return v
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), "ASSAY_REVIEW_PART_CONCURRENCY") {
			t.Errorf("ASSAY_REVIEW_PART_CONCURRENCY=%s: %v; want an error naming it", v, err)
		}
	}
	c = Config{Region: "us", Model: "m", PartConcurrency: 100}
	if err := c.defaults(); err == nil || !strings.Contains(err.Error(), "ASSAY_REVIEW_PART_CONCURRENCY") {
		t.Errorf("PartConcurrency 100: %v; want an error naming the setting", err)
	}
}
