package main

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// statements counts the statements one service of a cell starts whose SQL
// holds fragment: a test waits for the next passes of the service's loop
// by the statements they begin with, not by the time they usually take.
type statements struct {
	service, fragment string
	n                 atomic.Int64
}

// tracer is for cell.Options.StoreTracer.
func (s *statements) tracer(service string) pgx.QueryTracer {
	if service != s.service {
		return nil
	}
	return s
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, s.fragment) {
		s.n.Add(1)
	}
	return ctx
}

func (*statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// waitNext waits, for up to 30s, until n more of the statements started.
// A loop's passes run one after the other, so of n passes begun after the
// call, the first n-1 have also ended.
func (s *statements) waitNext(t *testing.T, n int64) {
	t.Helper()
	from := s.n.Load()
	for deadline := time.Now().Add(30 * time.Second); s.n.Load() < from+n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s started %d of %d statements holding %q in 30s", s.service, s.n.Load()-from, n, s.fragment)
		}
	}
}
