package classifier

// The batch lane through the provider's Batch API, when a cell turns it on.
// Batch-lane work is claimed and reserved as always, but instead of a call
// its attempt becomes a line waiting for a provider batch, its lease held
// as long as the batch may take. A ticker forms batches of waiting lines
// (custom_id = attempt id), submits them, polls them and, once a batch
// ends, reconciles every line by its custom_id, never by position: each
// answer goes through the same gate and verdict as an interactive answer
// and becomes its own attempt and ATTEMPT event, and so its own
// ledger row, at the table's batch price. A line the provider did not run
// (an expired, failed or canceled batch) is charged nothing; a line a
// finished batch does not mention is charged its reservation, estimated;
// either is retried within the work's attempts and deadline, or ends it.
//
// Everything a restart needs is in the cell's database: the line is
// written with the claim, the batch row before the provider sees it, the
// provider's batch id as soon as it is known (and the row's id travels in
// the batch's metadata, so a creation whose answer was lost is found, not
// sent twice), and each line is reconciled once, in the transaction that
// records its attempt.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"assay.dev/pkg/config"
	"assay.dev/pkg/consumer"
	"assay.dev/pkg/contract"
	"assay.dev/pkg/event"
	"assay.dev/pkg/lifecycle"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
	"assay.dev/pkg/telemetry"
)

// ProviderBatch configures the batch lane's use of the provider's Batch
// API.
type ProviderBatch struct {
	// On sends batch-lane work through the Batch API instead of one call
	// per attempt. Default off.
	On bool
	// URL is where the Batch API (files and batches) is asked. Default the
	// model's base URL.
	URL string
	// Window is the completion window asked for. Default 24h.
	Window time.Duration
	// MaxLines bounds the lines of one batch. Default 1000.
	MaxLines int
	// Flush is how long the oldest waiting line waits for more before its
	// batch is sent with fewer than MaxLines. Default 30s.
	Flush time.Duration
	// PollEvery is how often sent batches are polled and waiting lines
	// looked at. Default 30s.
	PollEvery time.Duration
	// SubmitTries bounds the tries at sending one batch; its lines then
	// end or retry as a transport error. Default 5.
	SubmitTries int
	// Grace is how long past the window a line's lease holds, so a worker
	// that restarts late still finds its lines its own. Default 1h.
	Grace time.Duration
}

func (p *ProviderBatch) defaults() {
	if p.Window <= 0 {
		p.Window = 24 * time.Hour
	}
	if p.MaxLines <= 0 {
		p.MaxLines = 1000
	}
	if p.Flush == 0 {
		p.Flush = 30 * time.Second
	}
	if p.PollEvery <= 0 {
		p.PollEvery = 30 * time.Second
	}
	if p.SubmitTries <= 0 {
		p.SubmitTries = 5
	}
	if p.Grace <= 0 {
		p.Grace = time.Hour
	}
}

// batchVars are the provider-batch settings FromEnv reads.
var batchVars = []config.Var{
	{Name: "ASSAY_PROVIDER_BATCH", Default: "off", Usage: "on: batch-lane work goes through the provider's Batch API"},
	{Name: "ASSAY_PROVIDER_BATCH_URL", Default: "ASSAY_MODEL_BASE_URL", Usage: "the Batch API's base URL (files and batches are appended, as to ASSAY_MODEL_BASE_URL)"},
	{Name: "ASSAY_PROVIDER_BATCH_WINDOW", Default: "24h", Usage: "the completion window asked for, in whole hours"},
	{Name: "ASSAY_PROVIDER_BATCH_MAX_LINES", Default: "1000", Usage: "lines in one provider batch at most"},
	{Name: "ASSAY_PROVIDER_BATCH_FLUSH", Default: "30s", Usage: "how long the oldest waiting line waits for more before its batch is sent"},
	{Name: "ASSAY_PROVIDER_BATCH_POLL", Default: "30s", Usage: "how often sent batches are polled"},
}

// fromEnv reads the provider-batch settings; every one is read, whatever
// the others say, so that Vars can be checked against what is read.
func (p *ProviderBatch) fromEnv(getenv func(string) string) error {
	on, rawURL := getenv("ASSAY_PROVIDER_BATCH"), getenv("ASSAY_PROVIDER_BATCH_URL")
	if err := config.Int(getenv, "ASSAY_PROVIDER_BATCH_MAX_LINES", &p.MaxLines, 1, 50000); err != nil {
		return err
	}
	if err := config.Durations(getenv,
		config.Duration{Name: "ASSAY_PROVIDER_BATCH_WINDOW", To: &p.Window, Min: time.Hour, Max: 7 * 24 * time.Hour},
		config.Duration{Name: "ASSAY_PROVIDER_BATCH_FLUSH", To: &p.Flush, Min: 0, Max: 24 * time.Hour},
		config.Duration{Name: "ASSAY_PROVIDER_BATCH_POLL", To: &p.PollEvery, Min: 10 * time.Millisecond, Max: time.Hour},
	); err != nil {
		return err
	}
	if p.Window%time.Hour != 0 {
		return fmt.Errorf("ASSAY_PROVIDER_BATCH_WINDOW: %s is not a whole number of hours", p.Window)
	}
	switch on {
	case "", "off":
		if rawURL != "" {
			return errors.New("ASSAY_PROVIDER_BATCH_URL: set while ASSAY_PROVIDER_BATCH is off; set ASSAY_PROVIDER_BATCH=on to use it")
		}
		return nil
	case "on":
		p.On = true
	default:
		return fmt.Errorf("ASSAY_PROVIDER_BATCH: %q is not on or off", config.Redacted(on))
	}
	if rawURL != "" {
		u, err := url.Parse(rawURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("ASSAY_PROVIDER_BATCH_URL: %q is not an http(s) URL", config.Redacted(rawURL))
		}
		p.URL = rawURL
	}
	return nil
}

// BatchAPI is what the batch lane asks of the provider; *model.Client is
// one.
type BatchAPI interface {
	RequestBody(call model.Call) ([]byte, error)
	UploadBatchFile(ctx context.Context, name string, content []byte) (model.FileObject, error)
	CreateBatch(ctx context.Context, inputFileID, window string, metadata map[string]string) (model.BatchObject, error)
	GetBatch(ctx context.Context, id string) (model.BatchObject, error)
	ListBatches(ctx context.Context, after string, limit int) (model.BatchList, error)
	FileContent(ctx context.Context, id string) ([]byte, error)
	DeleteFile(ctx context.Context, id string) error
}

// BatchStore is what the batch lane asks of the cell's database;
// *store.Store is one.
type BatchStore interface {
	EnqueueBatchLine(ctx context.Context, l store.BatchLine, hold time.Duration) (bool, error)
	PendingLines(ctx context.Context) (int, time.Duration, error)
	FormProviderBatch(ctx context.Context, id string, max int, hold time.Duration) (*store.ProviderBatch, []store.BatchLine, error)
	TakeProviderBatches(ctx context.Context, limit int, hold time.Duration) ([]*store.ProviderBatch, error)
	OpenLines(ctx context.Context, b *store.ProviderBatch) error
	GetWork(ctx context.Context, id string) (*store.Work, error)
	UpdateProviderBatch(ctx context.Context, id string, u store.ProviderBatchUpdate) error
	RecordBatchLine(ctx context.Context, lineOutcome string, r store.AttemptRecord) (applied bool, err error)
	FinishProviderBatch(ctx context.Context, id string) (store.LineCounts, bool, error)
}

// metadataKey names the batch row in the provider batch's metadata.
const metadataKey = "assay_batch"

// passHold is how long a pass holds a batch it works on; another worker
// takes it after that.
const passHold = 5 * time.Minute

// takeBatches bounds the batches one pass works on.
const takeBatches = 8

// batchLane is the batch lane's provider-batch half of one classifier.
type batchLane struct {
	s      *Service
	cfg    ProviderBatch
	api    BatchAPI
	st     BatchStore
	ticker lifecycle.Ticker
	lines  metric.Int64Counter
}

// newBatchLane builds the lane when cfg turns it on; nil when off.
func newBatchLane(s *Service, cfg ProviderBatch, d Deps) (*batchLane, error) {
	if !cfg.On {
		return nil, nil
	}
	cfg.defaults()
	l := &batchLane{s: s, cfg: cfg, api: d.Batches}
	if l.api == nil {
		mc, ok := d.Model.(*model.Client)
		if !ok {
			return nil, errors.New("classifier: the provider batch lane needs Deps.Batches, or a *model.Client as Deps.Model")
		}
		c := *mc
		if cfg.URL != "" {
			c.BatchURL = cfg.URL
		}
		if c.BatchBaseURL() == "" {
			return nil, errors.New("ASSAY_PROVIDER_BATCH_URL: required when the model is given as ASSAY_MODEL_ENDPOINT alone: the Batch API's base URL")
		}
		l.api = &c
	}
	l.st = d.Store
	var err error
	if l.lines, err = d.Tel.Meter().Int64Counter("assay_classifier_batch_lines",
		metric.WithDescription("provider batch lines reconciled, by how the provider answered them")); err != nil {
		return nil, err
	}
	t := &l.ticker
	t.Name, t.Every, t.Log, t.PassTimeout = "provider batches", cfg.PollEvery, d.Log, passHold-time.Minute
	t.Pass = l.pass
	return l, nil
}

// hold is how long a line's lease holds: the batch's window, the wait for
// its batch to form, and the grace.
func (l *batchLane) hold() time.Duration {
	return l.cfg.Window + l.cfg.Flush + l.cfg.PollEvery + l.cfg.Grace
}

// enqueue claims batch-lane work and makes its attempt a line waiting for
// a provider batch. The reservation is priced at the batch price, which
// the ledger charges.
func (l *batchLane) enqueue(ctx context.Context, w *store.Work, budgeted bool, c *contract.Contract) consumer.Disposition {
	s := l.s
	attemptID, token := newUUID(), newUUID()
	est := l.estimate(c, w)
	res := store.Reserved
	if budgeted {
		var err error
		if res, err = s.d.Store.Reserve(ctx, w.TenantID, attemptID, est); err != nil {
			s.d.Log.Warn("budget reservation failed", "key", w.ID, "err", err)
			return consumer.Retry(time.Second)
		}
	}
	if st := afford(res, w, est, time.Now(), s.backoff(1)); !st.proceed {
		if st.finish != "" {
			s.m.denied(ctx, w)
		}
		return s.carry(ctx, w.ID, w, st)
	}
	cw, ok, err := s.d.Store.Claim(ctx, w.ID, attemptID, token, s.cfg.LeaseTTL, est)
	if (err != nil || !ok) && budgeted {
		if rerr := s.d.Store.Release(context.WithoutCancel(ctx), attemptID); rerr != nil {
			s.d.Log.Warn("releasing a reservation failed", "key", w.ID, "attempt", attemptID, "err", rerr)
		}
	}
	if err != nil {
		s.d.Log.Warn("claim failed", "key", w.ID, "err", err)
		return consumer.Retry(time.Second)
	}
	if !ok {
		telemetry.Decision(ctx, s.d.Log, w.ID, "claim_lost", "another worker holds the lease or the work just ended")
		return consumer.Done()
	}
	s.m.claimed(ctx, cw, time.Now())
	ctx = context.WithoutCancel(ctx)
	line := store.BatchLine{AttemptID: attemptID, WorkID: cw.ID, TenantID: cw.TenantID, LeaseToken: token}
	line.Request, err = l.api.RequestBody(s.modelCall(c, cw))
	if err != nil {
		l.reconcile(ctx, line, cw, c, lineResult{line: store.LineUnsent, stillMine: true, unwritten: true,
			err: &model.Error{Kind: model.KindRejected, Msg: "encoding the batch line", Err: err}})
		return consumer.Done()
	}
	ok, err = l.st.EnqueueBatchLine(ctx, line, l.hold())
	switch {
	case err != nil:
		// Nothing was written and nothing sent: the attempt is recorded as
		// given back, and the work goes back at once.
		s.d.Log.Warn("writing a batch line failed", "key", cw.ID, "attempt", attemptID, "err", err)
		l.reconcile(ctx, line, cw, c, lineResult{line: store.LineUnsent, stillMine: true, unwritten: true,
			err: fmt.Errorf("the batch line could not be written, nothing was sent: %w", context.Canceled)})
		return consumer.Done()
	case !ok:
		l.reconcile(ctx, line, cw, c, lineResult{line: store.LineUnsent, unwritten: true})
		return consumer.Done()
	}
	telemetry.Decision(ctx, s.d.Log, cw.ID, "batched", "waiting for a provider batch",
		slog.String("attempt", attemptID), slog.Int("number", cw.Attempts))
	l.ticker.Kick()
	return consumer.Done()
}

// estimate bounds one line's cost from above at the batch price.
func (l *batchLane) estimate(c *contract.Contract, w *store.Work) int64 {
	s := l.s
	return s.cfg.Prices.BatchCostMicros(s.modelOf(w), s.inputUnits(c, w, len(w.Input)), int64(s.outputCap(w)))
}

// pass forms a batch when enough lines wait (or the oldest waited long
// enough), then works on the batches that are due.
func (l *batchLane) pass(ctx context.Context) (more bool, err error) {
	full, err := l.form(ctx)
	if err != nil {
		return false, err
	}
	taken, err := l.st.TakeProviderBatches(ctx, takeBatches, passHold)
	if err != nil {
		return false, err
	}
	for _, b := range taken {
		l.work(ctx, b)
	}
	return full || len(taken) == takeBatches, nil
}

// form makes a batch of waiting lines and submits it; full says more
// lines than one batch takes were waiting.
func (l *batchLane) form(ctx context.Context) (full bool, err error) {
	n, age, err := l.st.PendingLines(ctx)
	if err != nil || n == 0 || (n < l.cfg.MaxLines && age < l.cfg.Flush) {
		return false, err
	}
	b, dead, err := l.st.FormProviderBatch(ctx, newUUID(), l.cfg.MaxLines, passHold)
	if err != nil {
		return false, err
	}
	for _, line := range dead {
		// Its work ended or was taken back while it waited: never sent,
		// recorded stale, charged nothing.
		l.reconcileLine(ctx, nil, line, lineResult{line: store.LineUnsent})
	}
	if b != nil {
		l.submit(ctx, b)
	}
	return n > l.cfg.MaxLines, nil
}

// work moves one batch on: submit it, poll it, or reconcile it.
func (l *batchLane) work(ctx context.Context, b *store.ProviderBatch) {
	switch {
	case b.OpenCount == 0:
		l.finish(ctx, b, b.Status)
	case b.ProviderID == "" && strings.HasPrefix(b.Errors, abandoned):
		// Abandoned before all its lines were recorded: the rest end the
		// same way.
		if l.load(ctx, b) {
			l.abandon(ctx, b, b.Errors)
		}
	case b.ProviderID == "" && b.Errors != "":
		// Given up on before all its lines were recorded: the rest end
		// the same way, and its file is never sent.
		if l.load(ctx, b) {
			l.giveUp(ctx, b, &model.Error{Kind: model.KindTransient, Msg: "the provider batch was not submitted", Err: errors.New(b.Errors)})
		}
	case b.ProviderID == "":
		if l.load(ctx, b) {
			l.submit(ctx, b)
		}
	default:
		l.poll(ctx, b)
	}
}

// load reads a batch's open lines; false hands the batch back for the
// next poll.
func (l *batchLane) load(ctx context.Context, b *store.ProviderBatch) bool {
	if b.Open != nil {
		return true
	}
	if err := l.st.OpenLines(ctx, b); err != nil {
		l.s.d.Log.Warn("reading a provider batch's lines failed; read again next poll", "key", b.ID, "err", err)
		l.update(ctx, b, store.ProviderBatchUpdate{NextPoll: l.cfg.PollEvery})
		return false
	}
	return true
}

// submit sends a batch: upload its lines, create the provider's batch,
// record its id. A batch tried before may exist at the provider already
// (its creation's answer lost), so it is looked for first.
func (l *batchLane) submit(ctx context.Context, b *store.ProviderBatch) {
	if b.InputFileID != "" || b.SubmitTries > 0 {
		found, err := l.find(ctx, b)
		switch {
		case err != nil && b.SubmitTries+1 >= l.cfg.SubmitTries:
			// It may exist and run, and cannot be found: its lines are
			// charged as if it did.
			l.abandon(ctx, b, fmt.Sprintf("%s%s", abandoned, errText(err)))
			return
		case err != nil:
			l.s.d.Log.Warn("looking for a provider batch failed; looked for again", "key", b.ID, "try", b.SubmitTries+1, "err", err)
			l.update(ctx, b, store.ProviderBatchUpdate{SubmitFailed: "looking for the batch: " + errText(err), NextPoll: l.cfg.PollEvery})
			return
		}
		if found != nil {
			telemetry.Decision(ctx, l.s.d.Log, "provider_batch:"+b.ID, "submitted",
				"found at the provider by its metadata after its creation went unanswered", slog.String("provider_batch", found.ID))
			l.update(ctx, b, store.ProviderBatchUpdate{ProviderID: found.ID, Status: found.Status, NextPoll: l.cfg.PollEvery})
			return
		}
	}
	if b.SubmitTries >= l.cfg.SubmitTries {
		l.giveUp(ctx, b, &model.Error{Kind: model.KindTransient,
			Msg: fmt.Sprintf("the provider batch could not be submitted in %d tries", b.SubmitTries)})
		return
	}
	fileID := b.InputFileID
	if fileID == "" {
		lines := make([]model.BatchRequestLine, len(b.Open))
		for i, line := range b.Open {
			lines[i] = model.BatchRequestLine{CustomID: line.AttemptID, Method: "POST", URL: model.BatchChatEndpoint, Body: line.Request}
		}
		content, err := model.BatchInput(lines)
		if err != nil {
			l.giveUp(ctx, b, &model.Error{Kind: model.KindRejected, Msg: "encoding the batch file", Err: err})
			return
		}
		f, err := l.api.UploadBatchFile(ctx, "assay-"+b.ID+".jsonl", content)
		if err != nil {
			l.submitFailed(ctx, b, err)
			return
		}
		fileID = f.ID
		if err := l.st.UpdateProviderBatch(ctx, b.ID, store.ProviderBatchUpdate{InputFileID: fileID, KeepHold: true}); err != nil {
			l.s.d.Log.Warn("recording a provider batch's file failed", "key", b.ID, "err", err)
			return
		}
		b.InputFileID = fileID
	}
	obj, err := l.api.CreateBatch(ctx, fileID, fmt.Sprintf("%dh", int(l.cfg.Window/time.Hour)), map[string]string{metadataKey: b.ID})
	if err != nil {
		l.submitFailed(ctx, b, err)
		return
	}
	telemetry.Decision(ctx, l.s.d.Log, "provider_batch:"+b.ID, "submitted", fmt.Sprintf("%d lines sent", len(b.Open)),
		slog.String("provider_batch", obj.ID))
	l.update(ctx, b, store.ProviderBatchUpdate{ProviderID: obj.ID, Status: obj.Status, NextPoll: l.cfg.PollEvery})
}

// find looks for the provider's batch of b by its metadata, among the
// batches created since b was.
func (l *batchLane) find(ctx context.Context, b *store.ProviderBatch) (*model.BatchObject, error) {
	after := ""
	since := b.CreatedAt.Add(-time.Hour).Unix()
	for range 20 {
		page, err := l.api.ListBatches(ctx, after, 100)
		if err != nil {
			return nil, err
		}
		for i := range page.Data {
			pb := &page.Data[i]
			if pb.Metadata[metadataKey] == b.ID {
				return pb, nil
			}
			if pb.CreatedAt != 0 && pb.CreatedAt < since {
				return nil, nil
			}
		}
		if !page.HasMore || page.LastID == "" {
			return nil, nil
		}
		after = page.LastID
	}
	return nil, errors.New("the provider lists too many batches to look through")
}

// submitFailed records a failed try at submitting. A refusal for good ends
// the lines at once; anything else is tried again next poll.
func (l *batchLane) submitFailed(ctx context.Context, b *store.ProviderBatch, err error) {
	var mErr *model.Error
	if errors.As(err, &mErr) && mErr.Kind == model.KindRejected {
		l.giveUp(ctx, b, mErr)
		return
	}
	l.s.d.Log.Warn("submitting a provider batch failed; tried again", "key", b.ID, "try", b.SubmitTries+1, "err", err)
	l.update(ctx, b, store.ProviderBatchUpdate{SubmitFailed: errText(err), NextPoll: l.cfg.PollEvery})
}

// abandoned starts the recorded errors of a batch that was tried and could
// not be looked for: the provider may hold it.
const abandoned = "it may have been created and could not be looked for: "

// abandon ends a batch that may exist at the provider and cannot be found:
// each open line is missing, charged its reservation, and its work
// retries or ends.
func (l *batchLane) abandon(ctx context.Context, b *store.ProviderBatch, why string) {
	telemetry.Decision(ctx, l.s.d.Log, "provider_batch:"+b.ID, "abandoned", why, slog.Int("lines", len(b.Open)))
	if err := l.st.UpdateProviderBatch(ctx, b.ID, store.ProviderBatchUpdate{Errors: why, KeepHold: true}); err != nil {
		l.s.d.Log.Warn("recording a provider batch failed", "key", b.ID, "err", err)
	}
	for _, line := range b.Open {
		l.reconcileLine(ctx, b, line, lineResult{line: store.LineMissing, checkLease: true,
			err: &model.Error{Kind: model.KindTransient, Msg: "the provider batch " + strings.TrimSuffix(abandoned, ": "), Err: errors.New(why)}})
	}
	l.finish(ctx, b, "abandoned")
}

// giveUp ends a batch the provider never took: its lines were not sent,
// so each is recorded with why and charged nothing, and its work retries
// or ends as for any call that failed so.
func (l *batchLane) giveUp(ctx context.Context, b *store.ProviderBatch, cause *model.Error) {
	telemetry.Decision(ctx, l.s.d.Log, "provider_batch:"+b.ID, "not_submitted", cause.Error(), slog.Int("lines", len(b.Open)))
	if err := l.st.UpdateProviderBatch(ctx, b.ID, store.ProviderBatchUpdate{Errors: cause.Error(), KeepHold: true}); err != nil {
		l.s.d.Log.Warn("recording a provider batch failed", "key", b.ID, "err", err)
	}
	for _, line := range b.Open {
		l.reconcileLine(ctx, b, line, lineResult{line: store.LineUnsent, err: cause, checkLease: true})
	}
	l.finish(ctx, b, "not submitted")
}

// poll asks the provider how a batch stands, and reconciles it once it
// has ended.
func (l *batchLane) poll(ctx context.Context, b *store.ProviderBatch) {
	obj, err := l.api.GetBatch(ctx, b.ProviderID)
	var mErr *model.Error
	if errors.As(err, &mErr) && mErr.Status == http.StatusNotFound {
		// The provider no longer knows the batch: whether its lines ran
		// is unknown, so each is missing, charged its reservation.
		telemetry.Decision(ctx, l.s.d.Log, "provider_batch:"+b.ID, "lost", "the provider answers 404 for the batch",
			slog.String("provider_batch", b.ProviderID))
		obj = model.BatchObject{ID: b.ProviderID, Status: statusLost}
		if uerr := l.st.UpdateProviderBatch(ctx, b.ID, store.ProviderBatchUpdate{Status: statusLost, KeepHold: true}); uerr != nil {
			l.s.d.Log.Warn("recording a provider batch failed", "key", b.ID, "err", uerr)
			return
		}
		if l.load(ctx, b) {
			l.reconcileBatch(ctx, b, obj)
		}
		return
	}
	if err != nil {
		l.s.d.Log.Warn("polling a provider batch failed; polled again", "key", b.ID, "provider_batch", b.ProviderID, "err", err)
		l.update(ctx, b, store.ProviderBatchUpdate{NextPoll: l.cfg.PollEvery, Polled: true})
		return
	}
	u := store.ProviderBatchUpdate{Status: obj.Status, OutputFileID: obj.OutputFileID, ErrorFileID: obj.ErrorFileID,
		Counts: &store.BatchCounts{Total: obj.RequestCounts.Total, Completed: obj.RequestCounts.Completed,
			Failed: obj.RequestCounts.Failed}, Errors: batchErrors(obj), NextPoll: l.cfg.PollEvery, Polled: true}
	if !model.BatchEnded(obj.Status) {
		l.update(ctx, b, u)
		return
	}
	u.KeepHold = true
	if err := l.st.UpdateProviderBatch(ctx, b.ID, u); err != nil {
		l.s.d.Log.Warn("recording a provider batch failed", "key", b.ID, "err", err)
		return
	}
	if l.load(ctx, b) {
		l.reconcileBatch(ctx, b, obj)
	}
}

// statusLost is the status recorded for a batch the provider no longer
// knows.
const statusLost = "lost"

// batchErrors names what the provider said of a batch that failed: its
// error codes, never their messages, which may quote the input.
func batchErrors(obj model.BatchObject) string {
	if obj.Errors == nil {
		return ""
	}
	var codes []string
	for _, e := range obj.Errors.Data {
		codes = append(codes, e.Code)
	}
	return strings.Join(codes, ", ")
}

// reconcileBatch reads an ended batch's output and error files and
// reconciles each open line by its custom_id.
func (l *batchLane) reconcileBatch(ctx context.Context, b *store.ProviderBatch, obj model.BatchObject) {
	b.OutputFileID, b.ErrorFileID = cmp.Or(obj.OutputFileID, b.OutputFileID), cmp.Or(obj.ErrorFileID, b.ErrorFileID)
	answers := map[string]model.BatchOutputLine{}
	unreadable, repeated := 0, 0
	for _, id := range []string{obj.OutputFileID, obj.ErrorFileID} {
		if id == "" {
			continue
		}
		raw, err := l.api.FileContent(ctx, id)
		if err != nil {
			// Nothing is reconciled from half the answers: the whole batch
			// is read again next poll.
			l.s.d.Log.Warn("reading a provider batch's file failed; read again", "key", b.ID, "file", id, "err", err)
			l.update(ctx, b, store.ProviderBatchUpdate{NextPoll: l.cfg.PollEvery})
			return
		}
		lines, bad := model.ParseBatchOutput(raw)
		unreadable += bad
		for _, ol := range lines {
			if _, dup := answers[ol.CustomID]; dup {
				// A second answer for one line is not charged twice: the
				// first is the line's.
				repeated++
				continue
			}
			answers[ol.CustomID] = ol
		}
	}
	open := map[string]bool{}
	for _, line := range b.Open {
		open[line.AttemptID] = true
	}
	strangers := 0
	for id := range answers {
		if !open[id] {
			strangers++
		}
	}
	if unreadable+repeated+strangers > 0 {
		telemetry.Decision(ctx, l.s.d.Log, "provider_batch:"+b.ID, "lines_ignored",
			fmt.Sprintf("%d unreadable, %d repeated, %d naming no open line of this batch", unreadable, repeated, strangers))
	}
	for _, line := range b.Open {
		ol, found := answers[line.AttemptID]
		l.reconcileLine(ctx, b, line, lineOf(obj, ol, found, line))
	}
	l.finish(ctx, b, obj.Status)
}

// lineResult is what the provider did with one line.
type lineResult struct {
	// line is how the line is recorded: store.LineAnswered, ….
	line  string
	reply *model.Reply
	err   error
	// stillMine is the lease's state when it is known already;
	// checkLease asks the database instead.
	stillMine, checkLease bool
	// unwritten: the line was never written (its attempt is recorded
	// without one).
	unwritten bool
}

// lineOf decides what the provider did with one line, found or not among
// the answers of a batch that ended in obj.Status. A pure function of its
// inputs.
func lineOf(obj model.BatchObject, ol model.BatchOutputLine, found bool, line store.BatchLine) lineResult {
	r := lineResult{checkLease: true}
	switch {
	case found && ol.Response != nil:
		r.reply, r.err = model.LineReply(line.Request, *ol.Response)
		r.line = store.LineFailed
		if ol.Response.StatusCode >= 200 && ol.Response.StatusCode <= 299 {
			r.line = store.LineAnswered
		}
	case found && ol.Error != nil && ol.Error.Code == model.ErrorCodeBatchExpired:
		r.line, r.err = store.LineExpired, &model.Error{Kind: model.KindTransient,
			Msg: fmt.Sprintf("the provider batch %s ended %s before this line ran", obj.ID, obj.Status)}
	case found:
		code := ""
		if ol.Error != nil {
			code = ol.Error.Code
		}
		r.line, r.err = store.LineFailed, lineError(code)
	case obj.Status == model.BatchCompleted:
		r.line, r.err = store.LineMissing, &model.Error{Kind: model.KindTransient,
			Msg: fmt.Sprintf("the provider batch %s completed without a line for this attempt", obj.ID)}
	case obj.Status == statusLost:
		r.line, r.err = store.LineMissing, &model.Error{Kind: model.KindTransient,
			Msg: fmt.Sprintf("the provider no longer knows the batch %s", obj.ID)}
	default:
		// Expired, failed or canceled with no word of this line: it did
		// not run.
		r.line, r.err = store.LineExpired, &model.Error{Kind: model.KindTransient,
			Msg: fmt.Sprintf("the provider batch %s ended %s before this line ran", obj.ID, obj.Status), Provider: batchErrors(obj)}
	}
	return r
}

// lineError is the error of a line the provider answered with an error
// object: its code says what kind, its message is not repeated (it may
// quote the input).
func lineError(code string) *model.Error {
	kind := model.KindTransient
	switch {
	case strings.Contains(code, "rate_limit"):
		kind = model.KindRateLimited
	case strings.HasPrefix(code, "invalid") || code == "content_policy_violation":
		kind = model.KindRejected
	}
	return &model.Error{Kind: kind, Msg: fmt.Sprintf("the provider failed this line (code %q)", code)}
}

// reconcileLine reads the line's work and records its attempt.
func (l *batchLane) reconcileLine(ctx context.Context, b *store.ProviderBatch, line store.BatchLine, r lineResult) {
	w, err := l.st.GetWork(ctx, line.WorkID)
	if err != nil {
		l.s.d.Log.Warn("reading a batch line's work failed; reconciled next poll", "key", line.WorkID, "attempt", line.AttemptID, "err", err)
		return
	}
	c, known, err := l.s.contractOf(ctx, w)
	if err != nil {
		l.s.d.Log.Warn("reading a batch line's prompt failed; reconciled next poll", "key", w.ID, "attempt", line.AttemptID, "err", err)
		return
	}
	if !known {
		l.s.d.Log.Error("a batch line's contract is not known to this worker; left open", "key", w.ID, "contract", w.Contract)
		return
	}
	if r.checkLease {
		if r.stillMine, err = l.s.d.Store.ExtendLease(ctx, w.ID, line.LeaseToken, l.s.cfg.LeaseTTL); err != nil {
			// Unknown whether the lease holds; recorded as if not, the
			// committer's compare-and-set decides anyway.
			l.s.d.Log.Warn("lease check failed", "key", w.ID, "err", err)
		}
	}
	l.reconcile(ctx, line, w, c, r)
}

// reconcile is settle for a batch line: the same gate and verdict, the
// attempt, the work's next state and the ATTEMPT event, in the
// transaction that marks the line reconciled.
func (l *batchLane) reconcile(ctx context.Context, line store.BatchLine, w *store.Work, c *contract.Contract, r lineResult) {
	s := l.s
	a, raw := s.answerTo(w, c, r.reply, r.err, r.stillMine, w.Attempts)
	v, ok := l.recordLine(ctx, line, w, c, r, a, raw)
	if !ok {
		return
	}
	s.relay.Kick()
	s.countAttempt(ctx, w, v.outcome)
	l.lines.Add(ctx, 1, metric.WithAttributes(attribute.String("line", r.line), attribute.String("region", s.cfg.Region)))
	s.logVerdict(ctx, w, line.AttemptID, v, r.err, slog.String("line", r.line))
}

// recordLine records a batch line's attempt as judged on a, in the
// transaction that marks the line reconciled (or, for a line never
// written, in RecordAttempt). A lease gone meanwhile has the attempt
// recorded as what it then is. ok=false: nothing was recorded, and the
// line is reconciled next poll, or was already.
func (l *batchLane) recordLine(ctx context.Context, line store.BatchLine, w *store.Work, c *contract.Contract, r lineResult,
	a answer, raw []byte) (v verdict, ok bool) {
	s := l.s
	for {
		v = lineVerdict(judge(a, s.limits()), a.stillMine, r.line)
		att := l.lineAttempt(c, w, line.AttemptID, v.outcome, r)
		msgs, err := s.events(ctx, w, s.resultEvent(w, c, line.AttemptID, line.LeaseToken, v), &att)
		if err != nil {
			s.d.Log.Error("building a batch line's events failed", "key", w.ID, "attempt", line.AttemptID, "err", err)
			return v, false
		}
		rec := s.attemptRecord(w, line.AttemptID, line.LeaseToken, v, raw, msgs, false)
		applied, err := l.recordLineOnce(ctx, r, rec)
		if store.Permanent(err) {
			// The answer cannot be kept: recorded without it, as settle
			// does.
			applied, err = l.recordLineOnce(ctx, r, refusedLine(rec, a.hasOutput, err))
		}
		switch {
		case errors.Is(err, store.ErrLineReconciled):
			telemetry.Decision(ctx, s.d.Log, line.AttemptID, "duplicate", "batch line already reconciled")
			return v, false
		case err != nil:
			s.d.Log.Error("recording a batch line failed; reconciled next poll", "key", w.ID, "attempt", line.AttemptID, "err", err)
			return v, false
		}
		if applied || !a.stillMine {
			return v, true
		}
		// The lease went meanwhile (taken back, superseded): nothing was
		// written; the attempt is recorded as what it now is.
		a.stillMine = false
	}
}

// lineVerdict is v, judge's verdict on a batch line, with a line that did
// not run (expired, or missing from the answers) named so while the lease
// holds.
func lineVerdict(v verdict, stillMine bool, line string) verdict {
	if stillMine && (line == store.LineExpired || line == store.LineMissing) {
		v.outcome = map[string]string{store.LineExpired: outcome.AttemptBatchExpired, store.LineMissing: outcome.AttemptBatchMissing}[line]
		v.workReason = strings.Replace(v.workReason, outcome.AttemptTransportError, v.outcome, 1)
	}
	return v
}

// lineAttempt is the ATTEMPT event of a batch line's attempt, with the
// usage the provider's account of the line gives.
func (l *batchLane) lineAttempt(c *contract.Contract, w *store.Work, attemptID, oc string, r lineResult) event.Attempt {
	s := l.s
	att := s.attemptEvent(c, w, attemptID, oc, r.reply, r.err)
	att.Batch = true
	if r.line == store.LineFailed {
		// The provider's own account: the line failed, and a failed
		// line of a batch is billed nothing.
		att.InputUnits, att.OutputUnits, att.Estimated = 0, 0, false
	}
	if r.line == store.LineMissing {
		// It may have run and been billed with nothing to say so:
		// charged what was reserved for it, marked estimated.
		att.InputUnits, att.OutputUnits, att.Estimated = s.inputUnits(c, w, len(w.Input)), int64(s.outputCap(w)), true
	}
	return att
}

// recordLineOnce records rec in the transaction that marks r's line
// reconciled, or, for a line never written, as a plain attempt.
func (l *batchLane) recordLineOnce(ctx context.Context, r lineResult, rec store.AttemptRecord) (bool, error) {
	if r.unwritten {
		return l.s.d.Store.RecordAttempt(ctx, rec)
	}
	return l.st.RecordBatchLine(ctx, r.line, rec)
}

// refusedLine is rec, a batch line's record the database refused for good
// (cause), without its raw answer and ending the work as refusedVerdict
// says; its events are left as they were.
func refusedLine(rec store.AttemptRecord, hasOutput bool, cause error) store.AttemptRecord {
	v := refusedVerdict(rec.Outcome, hasOutput, cause)
	rec.Raw, rec.Change = nil, v.change
	rec.Outcome, rec.Reason, rec.WorkOutcome, rec.WorkReason = v.outcome, v.reason, v.workOutcome, v.workReason
	return rec
}

// finish marks a batch reconciled once every line is, or hands it back
// for the next poll.
func (l *batchLane) finish(ctx context.Context, b *store.ProviderBatch, status string) {
	c, done, err := l.st.FinishProviderBatch(ctx, b.ID)
	if err != nil || !done {
		if err != nil {
			l.s.d.Log.Warn("finishing a provider batch failed", "key", b.ID, "err", err)
		}
		l.update(ctx, b, store.ProviderBatchUpdate{NextPoll: l.cfg.PollEvery})
		return
	}
	telemetry.Decision(ctx, l.s.d.Log, "provider_batch:"+b.ID, "reconciled",
		fmt.Sprintf("batch %s: %d answered, %d failed, %d not run, %d missing", status, c.Answered, c.Failed, c.Expired, c.Missing),
		slog.String("provider_batch", b.ProviderID))
	// The inputs and answers are the cell's: once reconciled, the
	// provider's copies go.
	for _, id := range []string{b.InputFileID, b.OutputFileID, b.ErrorFileID} {
		if id == "" {
			continue
		}
		if err := l.api.DeleteFile(ctx, id); err != nil {
			l.s.d.Log.Warn("deleting a provider batch's file failed; it stays at the provider", "key", b.ID, "file", id, "err", err)
		}
	}
}

// update records what a pass learned and releases the batch.
func (l *batchLane) update(ctx context.Context, b *store.ProviderBatch, u store.ProviderBatchUpdate) {
	if err := l.st.UpdateProviderBatch(ctx, b.ID, u); err != nil {
		l.s.d.Log.Warn("recording a provider batch failed", "key", b.ID, "err", err)
	}
}
