package classifier_test

import (
	"bytes"
	"testing"

	"assay.dev/pkg/devkit/sim"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/event"
	"assay.dev/services/classifier"
)

// An ATTEMPT event carries the reasoning units the provider reported; split
// (ASSAY_ATTEMPT_EVENTS=split, while ledgers and committers of earlier
// releases run) it leaves the usage details out, so their strict decoders
// still read it.
func TestAttemptEventUsageDetails(t *testing.T) {
	t.Parallel()
	for _, split := range []bool{false, true} {
		b := newBundle(t, testenv.NATS(t), event.StreamSettings{}, func(c *classifier.Config) { c.SplitEvents = split })
		if err := b.sim.SetUsageDetails(sim.UsageDetails{ReasoningTokens: 24}); err != nil {
			t.Fatal(err)
		}
		if err := b.svc.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		b.enqueue(t, "post-1", "a post with reasons")
		raw := b.events(t, event.KindAttempt, 1)[0].Data
		att, err := event.Parse[event.Attempt](raw)
		switch {
		case err != nil:
			t.Fatal(err)
		case !split && (att.ReasoningUnits != 24 || att.CachedInputUnits != 0):
			t.Errorf("attempt %s: want the provider's 24 reasoning units and no cached ones", raw)
		case split && (bytes.Contains(raw, []byte("reasoningUnits")) || bytes.Contains(raw, []byte("cachedInputUnits"))):
			t.Errorf("split, the attempt %s carries usage details an earlier release refuses", raw)
		}
	}
}
