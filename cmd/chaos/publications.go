package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/outcome"
)

// markerRE finds the marker the publisher hides in every comment: the work
// id and the comment's key.
var markerRE = regexp.MustCompile(`<!-- assay:work=(\S+) key=(\S+) -->`)

// rerunKey is the marker key of the one conversation comment of dropped
// work, and of a partial review.
const rerunKey = "rerun"

// toGitHub reports whether a work item's outcome goes to the fake GitHub:
// a code review whose source names a pull request, owner/repo#n with n
// above 0 (the harness's chaos/code-review#0 names none). Every tenant's
// installation covers chaos/*, so none is left out for want of one.
func toGitHub(w *workRow) bool {
	if w.Contract != "code-review" {
		return false
	}
	repo, num, ok := strings.Cut(w.SourceID, "#")
	owner, name, ok2 := strings.Cut(repo, "/")
	n, err := strconv.ParseInt(num, 10, 64)
	return ok && ok2 && err == nil && n > 0 && owner != "" && name != ""
}

// expectation is what one ended work item must have at GitHub: a check run
// or none, and the keys of its comments, each exactly once.
type expectation struct {
	State    string
	CheckRun bool
	Keys     []string
	// Unknown, when set, says why the comments could not be worked out
	// (accepted work whose result cannot be read).
	Unknown string
}

// resultFinding is what the check reads of one finding of an accepted
// result.
type resultFinding struct {
	File string `json:"file"`
	Line int    `json:"line"`
}

// expect says what an outcome must publish, from the work's state and its
// accepted result alone, never from the publisher's record of what it
// sent: a publisher that lost a finding on its way records a plan that
// agrees with what it posted, and the check would then agree too. Accepted
// work gets its check run and one review comment per finding at a file and
// line (the contract's schema requires both), keyed by the finding's index
// among those; a partial review also the one comment that says how to have
// the rest reviewed. Dropped work gets no check run and one comment with
// its rerun command; any other outcome its check run and nothing more.
func expect(state string, findings []resultFinding, partial bool) expectation {
	e := expectation{State: state, CheckRun: state != outcome.Dropped}
	switch state {
	case outcome.Accepted:
		i := 0
		for _, f := range findings {
			if f.File != "" && f.Line > 0 {
				e.Keys = append(e.Keys, strconv.Itoa(i))
				i++
			}
		}
		if partial {
			e.Keys = append(e.Keys, rerunKey)
		}
	case outcome.Dropped:
		e.Keys = []string{rerunKey}
	}
	return e
}

// pubRow is what the check reads of one work item's GitHub publication.
type pubRow struct {
	State, LastError, Reason string
	Tries                    int
	NextTry                  *time.Time
	// PlanComments is how many comments the publisher's plan recorded,
	// shown beside a comment that is missing or not expected.
	PlanComments int
}

// ghHeld is what the fake GitHub holds, by work.
type ghHeld struct {
	Runs     map[string]int            // work id -> check runs
	Comments map[string]map[string]int // work id -> key -> comments
	Unmarked []int64                   // ids of comments with no marker
}

// heldBy reads what the fake GitHub holds. Every comment of a review is
// listed among its comments, so a finding counts the same whether it went
// out alone or in a review.
func heldBy(gh *fakegithub.Server) ghHeld {
	held := ghHeld{Runs: map[string]int{}, Comments: map[string]map[string]int{}}
	for _, r := range gh.CheckRuns() {
		held.Runs[r.ExternalID]++
	}
	for _, c := range gh.Comments() {
		m := markerRE.FindStringSubmatch(c.Body)
		if m == nil {
			held.Unmarked = append(held.Unmarked, c.ID)
			continue
		}
		if held.Comments[m[1]] == nil {
			held.Comments[m[1]] = map[string]int{}
		}
		held.Comments[m[1]][m[2]]++
	}
	return held
}

// pubTally is the publication check's verdict before it is worded.
type pubTally struct {
	Ended, Published, Failed, Pending, NoRow, Other int
	// Runs of RunsWanted published works that get a check run have
	// exactly one; Comments of CommentsWanted expected comments of
	// published works arrived exactly once.
	Runs, RunsWanted, Comments, CommentsWanted int
	// Twice counts check runs and comments made more than once; Unexpected
	// those no ended work's outcome publishes.
	Twice, Unexpected int
	// NoRow are the works with no GitHub publication at all, sorted.
	NoRowIDs  []string
	Offenders []string
}

// judgePublications says whether every ended work's publication arrived:
// published, exactly one check run where one is due and none where not,
// each expected comment exactly once, and nothing else. A publication the
// run left failed is a violation: the harness injects no fault at GitHub
// and leaves the publication deadline at its default of a day, so no fault
// it injects can fail one (a killed committer, a lost broker store or a
// failover only delays it), and a failure is reported with its last error.
func judgePublications(exp map[string]expectation, pubs map[string]pubRow, held ghHeld) pubTally {
	var t pubTally
	// Offenders by class, in the order the report names them.
	var failed, late, lost, twice, unexpected []string
	for id, e := range exp {
		t.Ended++
		p, ok := pubs[id]
		switch {
		case !ok:
			t.NoRow++
			t.NoRowIDs = append(t.NoRowIDs, id)
			late = append(late, fmt.Sprintf("%s (%s): no GitHub publication recorded", id, e.State))
		case p.State == "pending":
			t.Pending++
			next := "none set"
			if p.NextTry != nil {
				next = p.NextTry.UTC().Format(time.RFC3339)
			}
			late = append(late, fmt.Sprintf("%s (%s): publication still pending after %d tries (next try %s), last error: %s",
				id, e.State, p.Tries, next, orNone(p.LastError)))
		case p.State == "failed":
			t.Failed++
			failed = append(failed, fmt.Sprintf("%s (%s): publication failed after %d tries (%s), last error: %s; no fault of the run explains it",
				id, e.State, p.Tries, orNone(p.Reason), orNone(p.LastError)))
		case p.State != "published":
			t.Other++
			failed = append(failed, fmt.Sprintf("%s (%s): publication %s (%s)", id, e.State, p.State, orNone(p.Reason)))
		default:
			t.Published++
		}
		runs := held.Runs[id]
		switch {
		case runs > 1:
			t.Twice++
			twice = append(twice, fmt.Sprintf("%s: %d check runs", id, runs))
		case runs == 1 && !e.CheckRun:
			t.Unexpected++
			unexpected = append(unexpected, fmt.Sprintf("%s (%s): a check run, where its outcome gets none", id, e.State))
		}
		if ok && p.State == "published" && e.CheckRun {
			t.RunsWanted++
			if runs == 1 {
				t.Runs++
			} else if runs == 0 {
				lost = append(lost, fmt.Sprintf("%s (%s): published, and no check run arrived", id, e.State))
			}
		}
		if e.Unknown != "" {
			lost = append(lost, fmt.Sprintf("%s (%s): its comments cannot be checked: %s", id, e.State, e.Unknown))
		}
		got := held.Comments[id]
		for _, k := range e.Keys {
			n := got[k]
			if n > 1 {
				t.Twice++
				twice = append(twice, fmt.Sprintf("%s: comment %s posted %d times", id, k, n))
			}
			if !ok || p.State != "published" {
				continue
			}
			t.CommentsWanted++
			if n == 1 {
				t.Comments++
			} else if n == 0 {
				lost = append(lost, fmt.Sprintf("%s (%s): published, and comment %s of %s never arrived (the publisher's plan recorded %d comments)",
					id, e.State, k, keys(e.Keys), p.PlanComments))
			}
		}
		for _, k := range sortedKeys(got) {
			if !slices.Contains(e.Keys, k) && e.Unknown == "" {
				t.Unexpected++
				unexpected = append(unexpected, fmt.Sprintf("%s (%s): comment %s arrived (%d×), where its outcome publishes %s (the publisher's plan recorded %d comments)",
					id, e.State, k, got[k], keys(e.Keys), pubs[id].PlanComments))
			}
		}
	}
	for _, id := range sortedKeys(held.Runs) {
		if _, ok := exp[id]; !ok {
			t.Unexpected++
			unexpected = append(unexpected, fmt.Sprintf("%s: %d check runs, for work no ended pull request review", id, held.Runs[id]))
		}
	}
	for _, id := range sortedKeys(held.Comments) {
		if _, ok := exp[id]; !ok {
			t.Unexpected++
			unexpected = append(unexpected, fmt.Sprintf("%s: comments %s, for work no ended pull request review", id, keys(sortedKeys(held.Comments[id]))))
		}
	}
	for _, c := range held.Unmarked {
		t.Unexpected++
		unexpected = append(unexpected, fmt.Sprintf("comment %d carries no marker", c))
	}
	sort.Strings(t.NoRowIDs)
	for _, class := range [][]string{failed, late, lost, twice, unexpected} {
		sort.Strings(class)
		t.Offenders = append(t.Offenders, class...)
	}
	return t
}

// orNone is s, or "none" when it is empty.
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// keys writes comment keys as a list, "none" for none.
func keys(ks []string) string {
	if len(ks) == 0 {
		return "none"
	}
	return "[" + strings.Join(ks, " ") + "]"
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// pubWait is how the wait for the publishers went.
type pubWait struct {
	// Outstanding is how many ended pull request reviews had no settled
	// publication (pending, or no row yet) when the wait began, and Left
	// when it ended.
	Outstanding, Left int
	// Rate is the publications a second that sized the deadline, Budget
	// the deadline it gave, Waited how long the wait took.
	Rate           float64
	Budget, Waited time.Duration
}

// pubGrace is added to every wait for the publishers: what a publisher
// needs beyond its rate to pick up the last outcomes (its retrier looks
// every second, the committer's reaper reads back lost outcomes after its
// grace).
const pubGrace = 60 * time.Second

// awaitPublications waits until every ended pull request review has a
// settled GitHub publication (published, failed or skipped) and none is
// pending, polling the cells' publication rows. The deadline is sized at
// the start from the publications outstanding and the rate the run's
// publishers made theirs at (twice the time that rate needs, and a grace),
// and pushed out to a pending publication's next try, which its publisher
// makes no sooner. want is the ended reviews per region; endedRate, the
// rate they ended at, stands in while too few publications were made to
// measure one.
func (h *Harness) awaitPublications(ctx context.Context, want map[string]int, endedRate float64) pubWait {
	start := time.Now()
	var w pubWait
	var deadline time.Time
	var last string
	for {
		var pending, settled, published int64
		outstanding := 0
		var first, latest, nextTry time.Time
		answered := true
		for _, region := range config.DefaultRegions {
			var p, s, n int64
			var f, l, nt *time.Time
			err := h.pool[region].QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'pending'),
					count(*) FILTER (WHERE state <> 'pending'), count(published_at), min(published_at), max(published_at),
					max(next_try_at) FILTER (WHERE state = 'pending')
				FROM publications WHERE target = 'github'`).Scan(&p, &s, &n, &f, &l, &nt)
			if err != nil {
				// Postgres may be failing over; a settled cell is one
				// that answers.
				answered = false
				continue
			}
			pending, settled, published = pending+p, settled+s, published+n
			outstanding += max(0, want[region]-int(s))
			if f != nil && (first.IsZero() || f.Before(first)) {
				first = *f
			}
			if l != nil && l.After(latest) {
				latest = *l
			}
			if nt != nil && nt.After(nextTry) {
				nextTry = *nt
			}
		}
		if answered && deadline.IsZero() {
			w.Outstanding, w.Rate = outstanding, endedRate
			if span := latest.Sub(first); published >= 10 && span >= time.Second {
				w.Rate = float64(published) / span.Seconds()
			}
			w.Rate = max(w.Rate, 0.5)
			w.Budget = pubGrace + 2*time.Duration(float64(outstanding)/w.Rate*float64(time.Second))
			deadline = start.Add(w.Budget)
		}
		if answered && pending == 0 && outstanding == 0 {
			w.Left, w.Waited = 0, time.Since(start)
			return w
		}
		if !nextTry.IsZero() && nextTry.Add(pubGrace).After(deadline) && nextTry.Before(time.Now().Add(10*time.Minute)) {
			// A publication backing off is tried no sooner than this;
			// wait for that try (the backoff is capped at 5 minutes).
			deadline = nextTry.Add(pubGrace)
		}
		state := fmt.Sprintf("%d of %d ended pull request reviews have a settled publication, %d pending, %d without one yet",
			settled, sum(want), pending, max(0, outstanding-int(pending)))
		if !answered {
			state = "a cell does not answer"
		}
		if state != last {
			last = state
			h.logf("publishing: %s; waiting up to %s more", state, time.Until(deadline).Round(time.Second))
		}
		if (!deadline.IsZero() && time.Now().After(deadline)) || (deadline.IsZero() && time.Since(start) > pubGrace) {
			w.Left, w.Waited = outstanding, time.Since(start)
			return w
		}
		select {
		case <-ctx.Done():
			w.Left, w.Waited = outstanding, time.Since(start)
			return w
		case <-time.After(time.Second):
		}
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// readPublications reads every GitHub publication of both cells.
func (h *Harness) readPublications(ctx context.Context) (map[string]pubRow, error) {
	out := map[string]pubRow{}
	for _, region := range config.DefaultRegions {
		rows, err := h.pool[region].Query(ctx, `SELECT work_id, state, tries, coalesce(last_error, ''), coalesce(reason, ''),
				next_try_at, CASE WHEN jsonb_typeof(plan->'comments') = 'array' THEN jsonb_array_length(plan->'comments') ELSE 0 END
			FROM publications WHERE target = 'github'`)
		if err != nil {
			return nil, fmt.Errorf("read publications of %s: %w", region, err)
		}
		for rows.Next() {
			var id string
			var p pubRow
			if err := rows.Scan(&id, &p.State, &p.Tries, &p.LastError, &p.Reason, &p.NextTry, &p.PlanComments); err != nil {
				rows.Close()
				return nil, err
			}
			out[id] = p
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// expectations says what each ended pull request review must have at
// GitHub, reading the findings of every accepted one's result (and whether
// it was a partial review in parts) from its cell.
func (h *Harness) expectations(ctx context.Context, bound map[string]*workRow) (map[string]expectation, error) {
	type accepted struct {
		findings []byte
		partial  bool
	}
	results := map[string]accepted{}
	for _, region := range config.DefaultRegions {
		rows, err := h.pool[region].Query(ctx, `SELECT r.work_id, r.output->'findings', coalesce((a.coverage->>'partial')::boolean, false)
			FROM results r JOIN work w ON w.id = r.work_id AND r.schema_version = w.schema_version
			LEFT JOIN attempts a ON a.id = r.attempt_id
			WHERE w.contract = 'code-review' AND w.state = 'accepted'`)
		if err != nil {
			return nil, fmt.Errorf("read the accepted reviews of %s: %w", region, err)
		}
		for rows.Next() {
			var id string
			var a accepted
			if err := rows.Scan(&id, &a.findings, &a.partial); err != nil {
				rows.Close()
				return nil, err
			}
			results[id] = a
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	out := map[string]expectation{}
	for id, w := range bound {
		if w.State != outcome.Accepted {
			out[id] = expect(w.State, nil, false)
			continue
		}
		r, ok := results[id]
		if !ok {
			out[id] = expectation{State: w.State, CheckRun: true, Unknown: "accepted with no result"}
			continue
		}
		var fs []resultFinding
		if len(r.findings) > 0 {
			if err := json.Unmarshal(r.findings, &fs); err != nil {
				out[id] = expectation{State: w.State, CheckRun: true, Unknown: "its result's findings do not read: " + err.Error()}
				continue
			}
		}
		out[id] = expect(w.State, fs, r.partial)
	}
	return out, nil
}

// publications is check p: every ended pull request review's publication
// arrived at the fake GitHub, whatever was killed or lost on its way. It
// first waits for the publishers to settle every one (awaitPublications),
// then checks each: published; exactly one check run with its work id as
// external id (none for dropped work); each comment its outcome publishes
// (a review comment per finding of its accepted result) exactly once; no
// comment or check run that no outcome publishes; none failed.
func (h *Harness) publications(ctx context.Context, works map[string]*workRow) (check, error) {
	bound := map[string]*workRow{}
	want := map[string]int{}
	var from, to time.Time
	for id, w := range works {
		if !toGitHub(w) || !outcome.IsTerminal(w.State) {
			continue
		}
		bound[id], want[w.Region] = w, want[w.Region]+1
		if from.IsZero() || w.CreatedAt.Before(from) {
			from = w.CreatedAt
		}
		to = later(to, w.UpdatedAt)
	}
	endedRate := 0.0
	if span := to.Sub(from); span > 0 {
		endedRate = float64(len(bound)) / span.Seconds()
	}
	wait := h.awaitPublications(ctx, want, endedRate)
	pubs, err := h.readPublications(ctx)
	if err != nil {
		return check{}, err
	}
	exp, err := h.expectations(ctx, bound)
	if err != nil {
		return check{}, err
	}
	t := judgePublications(exp, pubs, heldBy(h.gh))
	// What became of the outcomes the publishers never recorded, for the
	// few the report names (at 100,000 items each read is a query).
	for _, id := range t.NoRowIDs[:min(len(t.NoRowIDs), 3)] {
		w := bound[id]
		var ob string
		if err := h.pool[w.Region].QueryRow(ctx, `SELECT coalesce(string_agg(format('outbox %s published %s set aside %s tries %s err %s',
				o.msg_id, o.published_at, q.set_aside_at, q.tries, q.last_error), '; '), 'no OUTCOME outbox row')
			FROM outbox o LEFT JOIN outbox_waiting q ON q.id = o.id
			WHERE o.stream = 'OUTCOME' AND o.msg_id LIKE $1 || '.%'`, id).Scan(&ob); err != nil {
			ob = err.Error()
		}
		h.note("no GitHub publication: %s (%s, %s): %s", id, w.State, w.Region, ob)
	}
	return check{N: "p", What: "publication: every ended pull request review's publication arrived at GitHub: exactly one check run (none for dropped work) and each finding's comment exactly once; none failed, nothing else posted",
		Figure: fmt.Sprintf("%d ended reviews: %d published, %d failed, %d pending, %d with no publication; check runs %d of %d, comments %d of %d arrived exactly once; %d made twice, %d not asked for; waited %s for %d outstanding (allowed %s at the run's %.1f publications/s)",
			t.Ended, t.Published, t.Failed+t.Other, t.Pending, t.NoRow, t.Runs, t.RunsWanted, t.Comments, t.CommentsWanted,
			t.Twice, t.Unexpected, wait.Waited.Round(time.Second), wait.Outstanding, wait.Budget.Round(time.Second), wait.Rate),
		OK: len(t.Offenders) == 0, Offenders: t.Offenders}, nil
}

// later is the later of two times.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
