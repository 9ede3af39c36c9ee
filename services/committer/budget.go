package committer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
)

// budgetConn is the connection to the region's account where the GitHub
// write budgets are kept, made on first use when the config names one.
type budgetConn struct {
	mu sync.Mutex
	nc *nats.Conn
	js jetstream.JetStream
}

// openBudget makes or finds the bucket of the installations' GitHub write
// budgets: the region's, in the region's account, when
// ASSAY_GITHUB_BUDGET_NATS_URL names it, else the cell's own, in its
// account. It tries once; the budget opens it again on a later write when
// it fails.
func (s *Service) openBudget(ctx context.Context) (jetstream.KeyValue, error) {
	var js jetstream.KeyValueManager = s.d.JS
	bucket := s.cfg.Names.GitHubBucket(s.cfg.Names.Cell)
	if url := s.cfg.GitHubBudgetNATSURL; url != "" {
		bucket = s.cfg.Names.GitHubBucket(s.cfg.Region)
		b := &s.budget
		b.mu.Lock()
		if b.nc == nil {
			nc, err := nats.Connect(url, nats.Name("assay-publisher-"+s.cfg.Names.Cell), nats.MaxReconnects(-1),
				nats.ReconnectWait(500*time.Millisecond))
			if err != nil {
				b.mu.Unlock()
				return nil, fmt.Errorf("ASSAY_GITHUB_BUDGET_NATS_URL: connect %s: %w", config.Redacted(url), config.RedactError(err, url))
			}
			rjs, err := jetstream.New(nc)
			if err != nil {
				nc.Close()
				b.mu.Unlock()
				return nil, fmt.Errorf("ASSAY_GITHUB_BUDGET_NATS_URL: %w", err)
			}
			b.nc, b.js = nc, rjs
		}
		js = b.js
		b.mu.Unlock()
	}
	return event.EnsureBucket(ctx, js, s.d.Log, jetstream.KeyValueConfig{Bucket: bucket, History: 1,
		TTL:         2 * time.Hour,
		Description: "each GitHub App installation's content-creating requests of the last hour, shared by the region's publishers"},
		s.cfg.Streams.Once())
}

// closeBudget closes the connection to the region's account, if one was
// made.
func (s *Service) closeBudget() {
	b := &s.budget
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.nc != nil {
		b.nc.Close()
		b.nc, b.js = nil, nil
	}
}
