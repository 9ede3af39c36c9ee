package dbpool_test

import (
	"testing"

	"assay.dev/pkg/dbpool"
)

func TestSize(t *testing.T) {
	t.Parallel()
	const url = "postgres://assay@db/assay"
	for _, c := range []struct {
		url   string
		asked int
		want  int
	}{
		{url, 0, dbpool.DefaultMaxConns},
		{url, 3, 3},
		{url + "?pool_max_conns=33", 0, 33},
		{url + "?pool_max_conns=33", 7, 7},
		{"::not a url", 0, dbpool.DefaultMaxConns},
	} {
		if got := dbpool.Size(c.url, c.asked); got != c.want {
			t.Errorf("Size(%q, %d) = %d, want %d", c.url, c.asked, got, c.want)
		}
	}
}
