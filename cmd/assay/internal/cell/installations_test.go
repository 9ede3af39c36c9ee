package cell_test

import (
	"context"
	"slices"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/outcome"
)

// Two installations on one NATS server, each with its own database, in the
// same region: each has its own streams and durables, and work submitted
// to one is decided there and never seen by the other.
func TestTwoInstallationsShareOneNATS(t *testing.T) {
	t.Parallel()
	natsURL := testenv.NATS(t)
	a := celltest.SetupOn(t, cell.Options{Config: config.Config{Installation: "assay"}}, nil, natsURL)
	b := celltest.SetupOn(t, cell.Options{Config: config.Config{Installation: "review-staging"}}, nil, natsURL)
	items := evalset.Items()
	_, ra := a.Submit(t, celltest.CodeReview(items[0], "installation a"))
	_, rb := b.Submit(t, celltest.CodeReview(items[0], "installation b"))
	for name, x := range map[string]struct {
		b  *celltest.Bundle
		id string
	}{"assay": {a, ra.WorkID}, "review-staging": {b, rb.WorkID}} {
		if v := x.b.Wait(t, x.id); *v.Outcome != outcome.Accepted {
			t.Errorf("%s: %s (%s)", name, *v.Outcome, v.Reason)
		}
	}
	// The same key in each: the same work id, decided once in each
	// installation's own database.
	if a.Count(t, `SELECT count(*) FROM attempts`) != 1 || b.Count(t, `SELECT count(*) FROM attempts`) != 1 {
		t.Errorf("attempts: %d in assay, %d in review-staging; want 1 each",
			a.Count(t, `SELECT count(*) FROM attempts`), b.Count(t, `SELECT count(*) FROM attempts`))
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var streams []string
	for name := range js.StreamNames(ctx).Name() {
		streams = append(streams, name)
	}
	for _, want := range []string{"ASSAY_WORK_US", "ASSAY_RESULT_US", "REVIEW_STAGING_WORK_US", "REVIEW_STAGING_RESULT_US"} {
		if !slices.Contains(streams, want) {
			t.Errorf("streams %v lack %s", streams, want)
		}
	}
	for stream, durable := range map[string]string{"ASSAY_RESULT_US": "assay-committer", "REVIEW_STAGING_RESULT_US": "review-staging-committer"} {
		if _, err := js.Consumer(ctx, stream, durable); err != nil {
			t.Errorf("consumer %s on %s: %v", durable, stream, err)
		}
	}
	if _, err := js.Consumer(ctx, "ASSAY_RESULT_US", "review-staging-committer"); err == nil {
		t.Error("one installation's committer is on the other's stream")
	}
}
