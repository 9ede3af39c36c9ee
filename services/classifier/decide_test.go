package classifier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/admission"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/event"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func TestScreen(t *testing.T) {
	t.Parallel()
	need := 2 * time.Second
	cases := []struct {
		name     string
		ev       event.Work
		proceed  bool
		decision string
		settle   consumer.Settle
	}{
		{"this cell's work", event.Work{Region: "us", DeadlineAt: t0.Add(time.Minute)}, true, "", consumer.Ack},
		{"no deadline announced", event.Work{Region: "us"}, true, "", consumer.Ack},
		{"another cell's work", event.Work{Region: "eu", DeadlineAt: t0.Add(time.Minute)}, false, "refused", consumer.Term},
		{"too close to its deadline", event.Work{Region: "us", DeadlineAt: t0.Add(time.Second)}, false, "passed_over", consumer.Ack},
		{"past its deadline", event.Work{Region: "us", DeadlineAt: t0.Add(-time.Second)}, false, "passed_over", consumer.Ack},
	}
	for _, c := range cases {
		st := screen(c.ev, "us", t0, need)
		if st.proceed != c.proceed || st.decision != c.decision || (!c.proceed && st.disp.Settle != c.settle) {
			t.Errorf("%s: %+v", c.name, st)
		}
	}
}

func TestAdmit(t *testing.T) {
	t.Parallel()
	need := 2 * time.Second
	ev := event.Work{WorkID: "w_1", TenantID: "acme", Region: "us"}
	work := func(f func(*store.Work)) *store.Work {
		w := &store.Work{ID: "w_1", TenantID: "acme", State: outcome.Queued, Contract: "code-review",
			Attempts: 1, DeadlineAt: t0.Add(time.Minute)}
		if f != nil {
			f(w)
		}
		return w
	}
	cases := []struct {
		name     string
		w        *store.Work
		known    bool
		proceed  bool
		finish   string
		decision string
		settle   consumer.Settle
	}{
		{"queued work", work(nil), true, true, "", "", consumer.Ack},
		{"running work whose lease lapsed", work(func(w *store.Work) { w.State = outcome.Running }), true, true, "", "", consumer.Ack},
		{"another tenant's message", work(func(w *store.Work) { w.TenantID = "globex" }), true, false, "", "refused", consumer.Term},
		{"already accepted", work(func(w *store.Work) { w.State = outcome.Accepted }), true, false, "", outcome.Accepted, consumer.Ack},
		{"already superseded", work(func(w *store.Work) { w.State = outcome.Superseded }), true, false, "", outcome.Superseded, consumer.Ack},
		{"deadline passed", work(func(w *store.Work) { w.DeadlineAt = t0 }), true, false, outcome.Expired, "", consumer.Ack},
		{"too little time left", work(func(w *store.Work) { w.DeadlineAt = t0.Add(time.Second) }), true, false, outcome.Expired, "", consumer.Ack},
		{"attempts spent", work(func(w *store.Work) { w.Attempts = 5 }), true, false, outcome.RetryExhausted, "", consumer.Ack},
		{"attempts lost to an outage are not counted", work(func(w *store.Work) { w.Attempts, w.OutageAttempts = 7, 3 }), true, true, "", "", consumer.Ack},
		{"contract unknown here", work(nil), false, false, outcome.TransportRejected, "", consumer.Ack},
	}
	for _, c := range cases {
		st := admit(ev, c.w, t0, need, 5, c.known)
		if st.proceed != c.proceed || st.finish != c.finish || st.decision != c.decision || st.disp.Settle != c.settle {
			t.Errorf("%s: %+v", c.name, st)
		}
	}
}

func TestAfford(t *testing.T) {
	t.Parallel()
	w := &store.Work{ID: "w_1", TenantID: "acme", DeadlineAt: t0.Add(time.Minute)}
	cases := []struct {
		name    string
		res     store.Reservation
		delay   time.Duration
		proceed bool
		finish  string
		disp    consumer.Disposition
	}{
		{"reserved", store.Reserved, time.Second, true, "", consumer.Disposition{}},
		{"spent budget", store.Exhausted, time.Second, false, outcome.BudgetExhausted, consumer.Done()},
		{"held by attempts in flight", store.Busy, time.Second, false, "", consumer.Retry(time.Second)},
		{"held past the deadline", store.Busy, 2 * time.Minute, false, outcome.BudgetExhausted, consumer.Done()},
	}
	for _, c := range cases {
		st := afford(c.res, w, 1234, t0, c.delay)
		if st.proceed != c.proceed || st.finish != c.finish || (!c.proceed && st.disp != c.disp) {
			t.Errorf("%s: %+v", c.name, st)
		}
	}
	if st := afford(store.Exhausted, w, 1234, t0, time.Second); !strings.Contains(st.reason, "1234 micro-dollars") {
		t.Errorf("exhausted reason %q does not give the estimate", st.reason)
	}
}

// The verdict on every kind of answer: one row per case the classifier
// decides, with what happens to the attempt, the work and the message.
func TestJudge(t *testing.T) {
	t.Parallel()
	l := limits{maxAttempts: 5, maxRepairs: 1}
	schemaFail := &gate.Failure{Stage: gate.StageSchema, Code: gate.CodeSchemaViolation, Detail: "findings[0].severity"}
	taxonomyFail := &gate.Failure{Stage: gate.StageCorrelation, Code: gate.CodeTaxonomyVersion, Detail: "taxonomy moved"}
	digestFail := &gate.Failure{Stage: gate.StageCorrelation, Code: gate.CodeDigest, Detail: "input changed"}
	rateLimited := func(after time.Duration) error {
		return &model.Error{Kind: model.KindRateLimited, Status: 429, RetryAfter: after}
	}
	base := answer{stillMine: true, attempts: 1, now: t0, deadline: t0.Add(10 * time.Minute), backoff: 700 * time.Millisecond}
	with := func(f func(*answer)) answer {
		a := base
		f(&a)
		return a
	}
	cases := []struct {
		name        string
		a           answer
		outcome     string
		change      store.WorkChange
		workOutcome string
		final       bool
		disp        consumer.Disposition
		next        string
	}{
		{"valid answer", with(func(a *answer) { a.hasOutput, a.output = true, "{}" }),
			outcome.AttemptOK, store.Handoff, "", true, consumer.Done(), "handed_to_committer"},
		{"invalid answer, repair left", with(func(a *answer) { a.hasOutput, a.fail = true, schemaFail }),
			outcome.AttemptInvalidOutput, store.Requeue, "", false, consumer.Retry(0), "repair"},
		{"invalid answer, repair spent", with(func(a *answer) { a.hasOutput, a.fail, a.repairs = true, schemaFail, 1 }),
			outcome.AttemptInvalidOutput, store.Handoff, "", true, consumer.Done(), "handed_to_committer"},
		{"invalid answer, attempts spent", with(func(a *answer) { a.hasOutput, a.fail, a.attempts = true, schemaFail, 5 }),
			outcome.AttemptInvalidOutput, store.Handoff, "", true, consumer.Done(), "handed_to_committer"},
		{"invalid answer, stale taxonomy (unfixable)", with(func(a *answer) { a.hasOutput, a.fail = true, taxonomyFail }),
			outcome.AttemptInvalidOutput, store.Handoff, "", true, consumer.Done(), "handed_to_committer"},
		{"invalid answer, digest moved (unfixable)", with(func(a *answer) { a.hasOutput, a.fail = true, digestFail }),
			outcome.AttemptInvalidOutput, store.Handoff, "", true, consumer.Done(), "handed_to_committer"},
		{"429 with Retry-After", with(func(a *answer) { a.err = rateLimited(3 * time.Second) }),
			outcome.AttemptRateLimited, store.Requeue, "", true, consumer.Retry(3 * time.Second), "retry"},
		{"429 without Retry-After", with(func(a *answer) { a.err = rateLimited(0) }),
			outcome.AttemptRateLimited, store.Requeue, "", true, consumer.Retry(700 * time.Millisecond), "retry"},
		{"429 whose Retry-After passes the deadline", with(func(a *answer) { a.err = rateLimited(11 * time.Minute) }),
			outcome.AttemptRateLimited, store.Finish, outcome.RetryExhausted, true, consumer.Done(), "ended"},
		{"5xx", with(func(a *answer) { a.err = &model.Error{Kind: model.KindTransient, Status: 503} }),
			outcome.AttemptTransportError, store.Requeue, "", true, consumer.Retry(700 * time.Millisecond), "retry"},
		{"connection error outside the adapter", with(func(a *answer) { a.err = errors.New("dial tcp: refused") }),
			outcome.AttemptTransportError, store.Requeue, "", true, consumer.Retry(700 * time.Millisecond), "retry"},
		{"timeout with time left", with(func(a *answer) { a.err = &model.Error{Kind: model.KindTimeout} }),
			outcome.AttemptTimeout, store.Requeue, "", true, consumer.Retry(700 * time.Millisecond), "retry"},
		{"timeout near the deadline", with(func(a *answer) {
			a.err, a.deadline = &model.Error{Kind: model.KindTimeout}, t0.Add(500*time.Millisecond)
		}), outcome.AttemptTimeout, store.Finish, outcome.RetryExhausted, true, consumer.Done(), "ended"},
		{"transient, attempts spent", with(func(a *answer) { a.err, a.attempts = &model.Error{Kind: model.KindTransient}, 5 }),
			outcome.AttemptTransportError, store.Finish, outcome.RetryExhausted, true, consumer.Done(), "ended"},
		{"refused for good", with(func(a *answer) { a.err = &model.Error{Kind: model.KindRejected, Status: 400} }),
			outcome.AttemptTransportRejected, store.Finish, outcome.TransportRejected, true, consumer.Done(), "ended"},
		{"worker stopping", with(func(a *answer) { a.err, a.attempts = fmt.Errorf("call: %w", context.Canceled), 5 }),
			outcome.AttemptCanceled, store.Requeue, "", true, consumer.Retry(0), "retry"},
		{"adapter saw the cancel", with(func(a *answer) { a.err = &model.Error{Kind: model.KindCanceled} }),
			outcome.AttemptCanceled, store.Requeue, "", true, consumer.Retry(0), "retry"},
		{"lease lost during the call", with(func(a *answer) { a.stillMine, a.hasOutput = false, true }),
			outcome.AttemptStaleLease, store.NoChange, "", true, consumer.Done(), "recorded_stale"},
		{"superseded while the call ran", with(func(a *answer) {
			a.stillMine, a.err = false, &model.Error{Kind: model.KindCanceled, Err: context.Canceled}
		}), outcome.AttemptStaleLease, store.NoChange, "", true, consumer.Done(), "recorded_stale"},
		{"503 with Retry-After", with(func(a *answer) {
			a.err = &model.Error{Kind: model.KindTransient, Status: 503, RetryAfter: 2 * time.Second}
		}), outcome.AttemptTransportError, store.Requeue, "", true, consumer.Retry(2 * time.Second), "retry"},
		{"2xx without choices", with(func(a *answer) { a.err = &model.Error{Kind: model.KindTransient, Status: 200} }),
			outcome.AttemptTransportError, store.Requeue, "", true, consumer.Retry(700 * time.Millisecond), "retry"},
		{"refusal", with(func(a *answer) { a.err = &model.Error{Kind: model.KindRefused, Status: 200} }),
			outcome.AttemptRefused, store.Finish, outcome.TransportRejected, true, consumer.Done(), "ended"},
		{"content filter", with(func(a *answer) { a.err = &model.Error{Kind: model.KindFiltered, Status: 200} }),
			outcome.AttemptContentFiltered, store.Finish, outcome.TransportRejected, true, consumer.Done(), "ended"},
		{"refusal, the contract retries them", with(func(a *answer) {
			a.err, a.retryRefusals = &model.Error{Kind: model.KindRefused, Status: 200}, true
		}), outcome.AttemptRefused, store.Requeue, "", true, consumer.Retry(700 * time.Millisecond), "retry"},
		{"tool call", with(func(a *answer) { a.err = &model.Error{Kind: model.KindToolCall, Status: 200} }),
			outcome.AttemptToolCall, store.Requeue, "", true, consumer.Retry(700 * time.Millisecond), "retry"},
		{"cut at the cap", with(func(a *answer) {
			a.err, a.outputCap, a.raisedCap = &model.Error{Kind: model.KindTruncated, Status: 200}, 1024, 2048
		}), outcome.AttemptTruncated, store.Requeue, "", true, consumer.Retry(0), "retry_raised_cap"},
		{"cut at the raised cap", with(func(a *answer) {
			a.err, a.outputCap, a.raisedCap = &model.Error{Kind: model.KindTruncated, Status: 200}, 2048, 0
		}), outcome.AttemptTruncated, store.Finish, outcome.RetryExhausted, true, consumer.Done(), "ended"},
		{"cut at the cap, attempts spent", with(func(a *answer) {
			a.err, a.outputCap, a.raisedCap, a.attempts = &model.Error{Kind: model.KindTruncated, Status: 200}, 1024, 2048, 5
		}), outcome.AttemptTruncated, store.Finish, outcome.RetryExhausted, true, consumer.Done(), "ended"},
	}
	for _, c := range cases {
		v := judge(c.a, l)
		if v.outcome != c.outcome || v.change != c.change || v.workOutcome != c.workOutcome || v.final != c.final ||
			v.disp != c.disp || v.next != c.next {
			t.Errorf("%s:\n got  %s change=%d work=%q final=%v disp=%+v next=%s\n want %s change=%d work=%q final=%v disp=%+v next=%s",
				c.name, v.outcome, v.change, v.workOutcome, v.final, v.disp, v.next,
				c.outcome, c.change, c.workOutcome, c.final, c.disp, c.next)
		}
		if v.change == store.Requeue && v.outcome == outcome.AttemptInvalidOutput && v.repairNote == "" {
			t.Errorf("%s: a repair re-ask without a note of what failed", c.name)
		}
		if v.change == store.Requeue && v.outcome != outcome.AttemptInvalidOutput && v.repairNote != "" {
			t.Errorf("%s: a retry carries a repair note %q", c.name, v.repairNote)
		}
		if v.change == store.Finish && v.workReason == "" {
			t.Errorf("%s: the work ends without a reason", c.name)
		}
		if (v.outputCap != 0) != (v.next == "retry_raised_cap") || (v.outputCap != 0 && v.outputCap != c.a.raisedCap) {
			t.Errorf("%s: next attempt's cap %d (next %s)", c.name, v.outputCap, v.next)
		}
	}
}

func TestRetryExhaustedSaysWhy(t *testing.T) {
	t.Parallel()
	l := limits{maxAttempts: 5, maxRepairs: 1}
	spent := judge(answer{stillMine: true, err: &model.Error{Kind: model.KindTransient}, attempts: 5,
		now: t0, deadline: t0.Add(time.Hour), backoff: time.Second}, l)
	if spent.workReason != "transport_error after 5 of 5 attempts" {
		t.Errorf("attempts spent: %q", spent.workReason)
	}
	late := judge(answer{stillMine: true, err: &model.Error{Kind: model.KindTimeout}, attempts: 1,
		now: t0, deadline: t0.Add(time.Second), backoff: 2 * time.Second}, l)
	if late.workReason != "timeout and the next try would pass the deadline" {
		t.Errorf("deadline: %q", late.workReason)
	}
	// An outage's: the reason says the provider was unavailable, so no
	// review item opens; while the deadline allows, the work waits instead.
	down := answer{stillMine: true, err: &model.Error{Kind: model.KindTransient}, attempts: 1, now: t0,
		deadline: t0.Add(time.Second), backoff: 2 * time.Second, outage: true,
		condition: "provider_unavailable: the model m has not answered since 2026-12-01T11:59:00Z (connection refused)"}
	ended := judge(down, l)
	if ended.workOutcome != outcome.RetryExhausted || !strings.HasPrefix(ended.workReason, outcome.ReasonProviderUnavailable+": ") ||
		!strings.HasSuffix(ended.workReason, "the next try would pass the deadline") {
		t.Errorf("outage past the deadline: %s %q", ended.workOutcome, ended.workReason)
	}
	down.deadline = t0.Add(time.Hour)
	if waits := judge(down, l); waits.change != store.Requeue || waits.workOutcome != "" {
		t.Errorf("outage within the deadline: %+v; want the work requeued", waits)
	}
}

// The attempts a budget counts leave out those lost to an outage.
func TestCountedAttempts(t *testing.T) {
	t.Parallel()
	w := &store.Work{Attempts: 6, OutageAttempts: 2}
	if n := counted(w, false); n != 4 {
		t.Errorf("counted = %d, want 4", n)
	}
	if n := counted(w, true); n != 3 {
		t.Errorf("counted with this attempt lost to the outage = %d, want 3", n)
	}
}

func TestOutputReachesTheGate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		reply *model.Reply
		err   error
		out   string
		has   bool
	}{
		{"answer", &model.Reply{Content: `{"a":1}`}, nil, `{"a":1}`, true},
		{"garbled 2xx body", &model.Reply{Raw: []byte(`{"choices":[`)}, &model.Error{Kind: model.KindMalformed}, `{"choices":[`, true},
		{"garbled, nothing read", nil, &model.Error{Kind: model.KindMalformed}, "", false},
		{"429", &model.Reply{Status: 429}, &model.Error{Kind: model.KindRateLimited}, "", false},
		{"no reply", nil, errors.New("boom"), "", false},
	}
	for _, c := range cases {
		out, has := output(c.reply, c.err)
		if out != c.out || has != c.has {
			t.Errorf("%s: %q %v", c.name, out, has)
		}
	}
}

// Usage no tokenizer can produce is not taken on trust: a negative count,
// more prompt units than bytes sent, more completion units than the cap or
// the answer's bytes allow.
func TestPlausibleUsage(t *testing.T) {
	t.Parallel()
	const req, ans, capped = 4000, 900, 512
	cases := []struct {
		name string
		u    model.Usage
		want bool
	}{
		{"an ordinary call", model.Usage{PromptTokens: 1000, CompletionTokens: 225}, true},
		{"nothing counted", model.Usage{}, true},
		{"every byte a unit, and framing", model.Usage{PromptTokens: req + framingUnits, CompletionTokens: capped + framingUnits}, true},
		{"hidden reasoning up to the cap", model.Usage{PromptTokens: 1000, CompletionTokens: capped}, true},
		{"negative prompt", model.Usage{PromptTokens: -1000, CompletionTokens: 225}, false},
		{"negative completion", model.Usage{PromptTokens: 1000, CompletionTokens: -1}, false},
		{"more prompt units than bytes", model.Usage{PromptTokens: req + framingUnits + 1, CompletionTokens: 225}, false},
		{"completion past cap and answer", model.Usage{PromptTokens: 1000, CompletionTokens: 1 << 40}, false},
	}
	for _, c := range cases {
		if got := plausible(c.u, req, ans, capped); got != c.want {
			t.Errorf("%s: plausible(%+v) = %v, want %v", c.name, c.u, got, c.want)
		}
	}
	// An answer that ran past the cap (a provider ignoring max_tokens) is
	// bounded by its bytes instead.
	if !plausible(model.Usage{PromptTokens: 1000, CompletionTokens: 1 << 20}, req, 5<<20, capped) {
		t.Error("a 5 MiB answer counted as 1 Mi units is possible")
	}
}

// What a call tells the adaptive limit: a 503 that says when to come back
// is congestion like a 429; a 2xx that is not output still answered in
// time; a refusal's 4xx or a plain 5xx says nothing of capacity.
func TestSignal(t *testing.T) {
	t.Parallel()
	reply := &model.Reply{Latency: 80 * time.Millisecond}
	cases := []struct {
		name  string
		reply *model.Reply
		err   error
		want  admission.SignalKind
	}{
		{"answer", reply, nil, admission.Success},
		{"429", reply, &model.Error{Kind: model.KindRateLimited, Status: 429}, admission.RateLimited},
		{"503 with Retry-After", reply, &model.Error{Kind: model.KindTransient, Status: 503, RetryAfter: time.Second}, admission.RateLimited},
		{"503 without Retry-After", reply, &model.Error{Kind: model.KindTransient, Status: 503}, admission.Ignore},
		{"timeout", nil, &model.Error{Kind: model.KindTimeout}, admission.Timeout},
		{"refusal", reply, &model.Error{Kind: model.KindRefused, Status: 200}, admission.Success},
		{"cut answer", reply, &model.Error{Kind: model.KindTruncated, Status: 200}, admission.Success},
		{"400", reply, &model.Error{Kind: model.KindRejected, Status: 400}, admission.Ignore},
	}
	for _, c := range cases {
		if got := signal(c.reply, c.err); got.Kind != c.want {
			t.Errorf("%s: signal %v, want %v", c.name, got.Kind, c.want)
		}
	}
}
