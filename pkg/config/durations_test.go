package config

import (
	"strings"
	"testing"
	"time"
)

func TestDurations(t *testing.T) {
	env := map[string]string{"A_TTL": "45s", "A_WAIT": "", "A_BAD": "soon", "A_LONG": "48h"}
	get := func(k string) string { return env[k] }
	ttl, wait := 30*time.Second, 10*time.Second
	if err := Durations(get,
		Duration{Name: "A_TTL", To: &ttl, Min: time.Second, Max: time.Hour},
		Duration{Name: "A_WAIT", To: &wait, Min: time.Second, Max: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if ttl != 45*time.Second || wait != 10*time.Second {
		t.Fatalf("ttl %s wait %s, want 45s (set) and 10s (unset keeps the default)", ttl, wait)
	}
	for _, name := range []string{"A_BAD", "A_LONG"} {
		var d time.Duration
		err := Durations(get, Duration{Name: name, To: &d, Min: time.Second, Max: 24 * time.Hour})
		if err == nil || !strings.HasPrefix(err.Error(), name+": ") || d != 0 {
			t.Fatalf("%s: err %v, value %s; want an error naming the variable and no change", name, err, d)
		}
	}
}
