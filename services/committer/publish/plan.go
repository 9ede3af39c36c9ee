// Package publish turns a work item's outcome into what its source sees:
// a GitHub check run and one pull request review carrying a comment per
// finding, the rerun comment of dropped work, or (with no GitHub App configured) a record of what would be
// published. The decision is Decide, a pure function; Publisher carries it
// out behind the publication fence.
package publish

import (
	"fmt"
	"strings"

	"assay.dev/pkg/diff"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// CheckName is the name of every check run assay makes.
const CheckName = "assay"

// Plan is what one outcome publishes. It is recorded with the
// publication, so a dry run shows exactly what GitHub would have got.
type Plan struct {
	WorkID     string `json:"workId"`
	Outcome    string `json:"outcome"`
	Repository string `json:"repository,omitempty"`
	Number     int64  `json:"number,omitempty"`
	HeadSHA    string `json:"headSha,omitempty"`
	// CheckRun is nil when the outcome gets none (dropped work).
	CheckRun *CheckRun `json:"checkRun,omitempty"`
	// Comments are review comments at file and line, one per accepted
	// finding, made together as one pull request review.
	Comments []Comment `json:"comments,omitempty"`
	// Review is the body of that review; empty when there are no comments.
	Review string `json:"review,omitempty"`
	// Rerun is the body of the one pull request comment of dropped work,
	// or of a partial review: what happened and the command to run.
	Rerun string `json:"rerun,omitempty"`
}

// CheckRun is a completed check run.
type CheckRun struct {
	Conclusion string `json:"conclusion"`
	Title      string `json:"title"`
	Summary    string `json:"summary"`
}

// Comment is one review comment. Key identifies it within the work (the
// finding's index), so a second publication finds and edits it.
type Comment struct {
	Key  string `json:"key"`
	Path string `json:"path"`
	Line int    `json:"line"`
	Body string `json:"body"`
}

// Finding is one code-review finding of an accepted result.
type Finding struct {
	File     string `json:"file"`
	Line     int    `json:"line"`
	Severity string `json:"severity"`
	Summary  string `json:"summary"`
	Evidence string `json:"evidence"`
}

// Findings reads the findings of an accepted code review's output, as the
// gate read it when it accepted it (gate.Read): a line written 2.0 is line
// 2 here as it was there. An output that cannot be read, or a finding
// with no file and line to comment at, is an error that fails the
// publication: it never passes as a review with no findings.
func Findings(output []byte) ([]Finding, error) {
	acc, err := gate.Read(output)
	if err != nil {
		return nil, fmt.Errorf("publish: the accepted answer cannot be read: %w", err)
	}
	out := make([]Finding, 0, len(acc.Findings))
	for i, f := range acc.Findings {
		if f.File == "" || f.Line < 1 {
			return nil, fmt.Errorf("publish: findings[%d] of the accepted answer names no file and line to comment at", i)
		}
		out = append(out, Finding{File: f.File, Line: f.Line, Severity: f.Severity, Summary: f.Summary, Evidence: f.Evidence})
	}
	return out, nil
}

// Input is what Decide looks at.
type Input struct {
	WorkID  string
	Outcome string
	// Reason is the work's reason (a dropped work's says how to rerun).
	Reason   string
	Findings []Finding
	// Policy is the tenant's check policy: store.CheckAdvisory or
	// store.CheckBlocking.
	Policy string
	// Rerun is the command that runs dropped work again; Rest the one that
	// reviews the rest of a partial review (without its cost cap).
	Rerun  string
	Rest   string
	Source store.PullSource
	// Coverage is what a review in parts covered; nil for a review whole.
	Coverage *diff.Coverage
}

// Decide says what an outcome publishes. Only accepted work, and work a
// person reviewed, gets review comments; superseded and expired work gets a check run that says so;
// dropped work gets one comment with its rerun command and no check run,
// and a partial review one comment with the command that reviews the rest.
func Decide(in Input) Plan {
	p := Plan{WorkID: in.WorkID, Outcome: in.Outcome, HeadSHA: in.Source.HeadSHA, Number: in.Source.Number}
	if in.Source.Owner != "" {
		p.Repository = in.Source.Owner + "/" + in.Source.Repo
	}
	switch in.Outcome {
	case outcome.Accepted, outcome.Reviewed:
		blocking := 0
		for i, f := range in.Findings {
			if f.Severity == "blocking" {
				blocking++
			}
			p.Comments = append(p.Comments, Comment{Key: fmt.Sprint(i), Path: f.File, Line: f.Line,
				Body: fmt.Sprintf("**%s**: %s", f.Severity, f.Summary)})
		}
		c := &CheckRun{Conclusion: "success", Title: "No findings", Summary: "assay reviewed this revision and found nothing to report."}
		switch {
		case blocking > 0 && in.Policy == store.CheckBlocking:
			c.Conclusion = "failure"
			c.Title = fmt.Sprintf("%d blocking of %s", blocking, findings(len(in.Findings)))
		case len(in.Findings) > 0:
			// Neutral: the check does not fail, and the title says why
			// rather than reading as "blocking" and "advisory" at once.
			c.Conclusion = "neutral"
			c.Title = findings(len(in.Findings)) + ", none blocking"
			if blocking > 0 {
				c.Title = fmt.Sprintf("%s, %d marked blocking (advisory: this check does not fail)", findings(len(in.Findings)), blocking)
			}
		}
		if len(in.Findings) > 0 {
			c.Summary = fmt.Sprintf("assay reviewed this revision: %s, posted as review comments.", findings(len(in.Findings)))
			p.Review = fmt.Sprintf("assay reviewed this revision and found %s; the check run %q sums them up.",
				findings(len(in.Findings)), CheckName)
		}
		if cv := in.Coverage; cv != nil {
			partial(c, cv)
			if cv.Partial {
				// One comment on the pull request says the review is
				// partial and how to have the rest reviewed.
				p.Rerun = restNote(cv, in.Rest)
				c.Summary += "\n\n" + restCommand(cv, in.Rest)
			}
		}
		if in.Outcome == outcome.Reviewed {
			if p.Review != "" {
				p.Review = fmt.Sprintf("A person reviewed the model's findings on this revision and stands by %s; the check run %q sums them up.",
					findings(len(in.Findings)), CheckName)
			}
			c.Title = "Reviewed by a person: " + c.Title
			c.Summary = "A person reviewed the model's findings on this revision and stands by these.\n\n" + c.Summary
		}
		p.CheckRun = c
	case outcome.Superseded:
		p.CheckRun = &CheckRun{Conclusion: "skipped", Title: "Superseded by a newer revision",
			Summary: "A newer push arrived before this revision was reviewed; the newer revision gets the review."}
	case outcome.Expired:
		p.CheckRun = &CheckRun{Conclusion: "timed_out", Title: "Review expired",
			Summary: "The review's deadline passed before a result was accepted; nothing was published."}
	case outcome.Canceled:
		p.CheckRun = &CheckRun{Conclusion: "cancelled", Title: "Review canceled", Summary: "The review was canceled."}
	case outcome.Dropped:
		if strings.HasPrefix(in.Reason, outcome.ReasonDiffTooLarge) {
			// No rerun command: the diff was not kept.
			_, why, _ := strings.Cut(in.Reason, ": ")
			p.Rerun = "assay did not review this pull request: " + why + "."
			break
		}
		p.Rerun = fmt.Sprintf("assay could not take this review when it arrived (%s). To run it, ask an operator to run:\n\n    %s",
			strings.TrimSpace(dropCause(in.Reason)), in.Rerun)
	default:
		p.CheckRun = &CheckRun{Conclusion: "neutral", Title: "No review (" + in.Outcome + ")",
			Summary: "assay did not produce a review of this revision: " + in.Outcome + "."}
	}
	return p
}

// partial says on a check run what a review in parts covered: every part,
// or, for a partial review, which files were not reviewed and why. A
// partial review never reads as a clean pass.
func partial(c *CheckRun, cv *diff.Coverage) {
	var b strings.Builder
	fmt.Fprintf(&b, "The diff was reviewed in %d parts, one model call each.", cv.Parts)
	if len(cv.Earlier) > 0 {
		fmt.Fprintf(&b, " This review continues that of work %s: its parts %s were reviewed and published there and are not shown again; this one reviewed %s.",
			cv.Of, strings.Join(cv.Earlier, ", "), idsOr(cv.Reviewed))
	}
	if cv.Partial {
		if c.Conclusion == "success" {
			c.Conclusion, c.Title = "neutral", "No findings in the part reviewed"
		}
		c.Title = "Partial review: " + c.Title
		fmt.Fprintf(&b, " This is a partial review: %d of the %d parts were reviewed, because %s.", len(cv.Reviewed)+len(cv.Earlier), cv.Parts, cv.Why)
		fmt.Fprintf(&b, "\n\nReviewed (%d): %s\n\nNot reviewed (%d): %s", len(cv.Files), files(cv.Files), len(cv.Left), files(cv.Left))
	}
	if len(cv.Skipped) > 0 {
		var sk []string
		for _, f := range cv.Skipped {
			sk = append(sk, fmt.Sprintf("%s (%s)", f.Path, f.Reason))
		}
		fmt.Fprintf(&b, "\n\nSkipped: %s", strings.Join(sk, ", "))
	}
	if cv.Folded > 0 {
		fmt.Fprintf(&b, "\n\n%s made by two parts are shown once.", findings(cv.Folded))
	}
	if cv.Dropped > 0 {
		fmt.Fprintf(&b, "\n\n%s beyond the contract's cap are not shown (the least severe).", findings(cv.Dropped))
	}
	c.Summary += "\n\n" + b.String()
}

// restCommand is the command that reviews what a partial review left, with
// the cost cap its parts left are estimated at.
func restCommand(cv *diff.Coverage, rest string) string {
	cmd := rest
	if cv.LeftCost > 0 {
		cmd = fmt.Sprintf("%s --cost-cap %d", rest, cv.LeftCost)
	}
	return fmt.Sprintf("To have the rest reviewed (the parts left are estimated at %s), ask an operator to run:\n\n    %s",
		dollars(cv.LeftCost), cmd)
}

// restNote is the one comment a partial review posts on its pull request.
func restNote(cv *diff.Coverage, rest string) string {
	return fmt.Sprintf("assay reviewed this pull request only in part: %d of its %d parts, because %s. Not reviewed (%d): %s\n\n%s",
		len(cv.Reviewed)+len(cv.Earlier), cv.Parts, cv.Why, len(cv.Left), files(cv.Left), restCommand(cv, rest))
}

// dollars writes micro-dollars as dollars.
func dollars(micros int64) string { return fmt.Sprintf("$%.4f", float64(micros)/1e6) }

// idsOr lists part ids, "none" for none.
func idsOr(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, ", ")
}

// files lists paths for a summary, the first 50 of them.
func files(paths []string) string {
	if len(paths) == 0 {
		return "none"
	}
	if len(paths) > 50 {
		return fmt.Sprintf("%s and %d more", strings.Join(paths[:50], ", "), len(paths)-50)
	}
	return strings.Join(paths, ", ")
}

// dropCause is the part of a dropped work's reason before its rerun hint.
func dropCause(reason string) string {
	cause, _, _ := strings.Cut(reason, "; ask again with:")
	if cause == "" {
		return "over its admission rate"
	}
	return cause
}

// marker is hidden in every comment and review body: it carries the work
// id and the comment's key (reviewKey for a review), so a publisher that
// died before recording an id finds what it made instead of posting
// another.
func marker(workID, key string) string {
	return fmt.Sprintf("<!-- assay:work=%s key=%s -->", workID, key)
}

// withMarker is a comment body as posted.
func withMarker(body, workID, key string) string { return body + "\n\n" + marker(workID, key) }

// rerunKey is the marker key of the rerun comment.
const rerunKey = "rerun"

// reviewKey is the marker key of the review an outcome makes. It names the
// outcome: a later outcome of the same work (a person's review after the
// model's) may make a review of its own, for findings the earlier one did
// not comment on, and each outcome finds its own.
func reviewKey(outcome string) string { return "review-" + outcome }

// findings is "1 finding", "2 findings".
func findings(n int) string {
	if n == 1 {
		return "1 finding"
	}
	return fmt.Sprintf("%d findings", n)
}
