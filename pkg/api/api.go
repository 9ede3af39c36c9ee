// Package api holds the HTTP API's request and answer types: what ingress
// decodes and writes, and what the operator's tool and any other client
// send and read. It is a leaf: it imports the standard library alone, so a
// client takes the wire format without the service. The types are held to
// the OpenAPI document (schemas/openapi.yaml) by this package's tests.
package api

import (
	"encoding/json"
	"time"
)

// SubmitRequest is the body of POST /v1/work.
type SubmitRequest struct {
	Contract string          `json:"contract"`
	SourceID string          `json:"sourceId"`
	Revision string          `json:"revision"`
	Lane     string          `json:"lane,omitempty"`
	Input    json.RawMessage `json:"input"`
	// DeadlineSeconds overrides the lane's default deadline.
	DeadlineSeconds int `json:"deadlineSeconds,omitempty"`
}

// SubmitResponse answers POST /v1/work.
type SubmitResponse struct {
	WorkID    string `json:"workId"`
	State     string `json:"state"`
	Duplicate bool   `json:"duplicate"`
	Region    string `json:"region"`
	Links     Links  `json:"links"`
}

// Links point at the work's resources.
type Links struct {
	Self string `json:"self"`
}

// WorkView answers GET /v1/work/{id}.
type WorkView struct {
	WorkID   string `json:"workId"`
	TenantID string `json:"tenantId"`
	Region   string `json:"region"`
	Contract string `json:"contract"`
	// SchemaVersion is the contract version the work was made for, which
	// its result has.
	SchemaVersion string        `json:"schemaVersion"`
	SourceID      string        `json:"sourceId"`
	Revision      string        `json:"revision"`
	Lane          string        `json:"lane"`
	State         string        `json:"state"`
	Outcome       *string       `json:"outcome"`
	Reason        string        `json:"reason,omitempty"`
	DeadlineAt    time.Time     `json:"deadlineAt"`
	CreatedAt     time.Time     `json:"createdAt"`
	UpdatedAt     time.Time     `json:"updatedAt"`
	Attempts      []AttemptView `json:"attempts"`
	Result        *ResultView   `json:"result,omitempty"`
	// Publications are where the outcome went, one per target.
	Publications []PublicationView `json:"publications"`
	// View is the work's one state, whatever path settled it, as GET
	// /v1/views counts it: running, accepted, needs_review (its review item
	// is open), rejected or terminal. Work whose answer a person published
	// from the review screen is accepted, though State and Outcome stay
	// what the pipeline ended it with.
	View string `json:"view"`
	// Review is the work's review item, when it has one: open, or resolved
	// with the verdict, who resolved it (the actor the credential named)
	// and when, and the answer a person published.
	Review *WorkReview `json:"review,omitempty"`
}

// WorkReview is a work's review item as its work shows it: the item, and
// the answer it was resolved with and published (approved as it was, or
// amended), which the work's reviewed outcome carries.
type WorkReview struct {
	ReviewView
	Output json.RawMessage `json:"output,omitempty"`
}

// AttemptView is one attempt of a work item.
type AttemptView struct {
	AttemptID  string     `json:"attemptId"`
	Number     int        `json:"number"`
	Outcome    string     `json:"outcome"`
	Reason     string     `json:"reason,omitempty"`
	StartedAt  time.Time  `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// Part is set for a review in parts: the part a call was made for
	// (p1, p2, …), or "*" for the claimed attempt, which made no call.
	Part string `json:"part,omitempty"`
}

// PublicationView is a work item's publication to one target: GitHub (its
// check run and comment ids), the tenant's callback, the dry record of a
// cell without a GitHub App, or "none" with why nothing was published. A
// pending one is tried again at nextTryAt until deadlineAt; a failed one
// waits for assay publish retry.
type PublicationView struct {
	Target         string           `json:"target"`
	State          string           `json:"state"`
	Outcome        string           `json:"outcome"`
	CheckRunID     int64            `json:"checkRunId,omitempty"`
	CommentIDs     map[string]int64 `json:"commentIds,omitempty"`
	RerunCommentID int64            `json:"rerunCommentId,omitempty"`
	Tries          int              `json:"tries"`
	LastError      string           `json:"lastError,omitempty"`
	Reason         string           `json:"reason,omitempty"`
	LastTriedAt    *time.Time       `json:"lastTriedAt,omitempty"`
	NextTryAt      *time.Time       `json:"nextTryAt,omitempty"`
	DeadlineAt     *time.Time       `json:"deadlineAt,omitempty"`
	PublishedAt    *time.Time       `json:"publishedAt,omitempty"`
}

// ResultView is the accepted output of a work item.
type ResultView struct {
	SchemaVersion string          `json:"schemaVersion"`
	AttemptID     string          `json:"attemptId"`
	Output        json.RawMessage `json:"output"`
	Findings      int             `json:"findings"`
	CreatedAt     time.Time       `json:"createdAt"`
	// Coverage says what a review in parts covered: its parts, the files
	// reviewed and, for a partial review, those not reviewed and why.
	Coverage json.RawMessage `json:"coverage,omitempty"`
}

// WorkSummary is one work item in GET /v1/work.
type WorkSummary struct {
	WorkID     string    `json:"workId"`
	TenantID   string    `json:"tenantId"`
	Contract   string    `json:"contract"`
	SourceID   string    `json:"sourceId"`
	Revision   string    `json:"revision"`
	Lane       string    `json:"lane"`
	State      string    `json:"state"`
	Outcome    *string   `json:"outcome"`
	Reason     string    `json:"reason,omitempty"`
	Attempts   int       `json:"attempts"`
	DeadlineAt time.Time `json:"deadlineAt"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	Links      Links     `json:"links"`
}

// WorkList answers GET /v1/work: a page of the token's tenant's work,
// oldest first; Next, when set, is the cursor of the next page.
type WorkList struct {
	Items []WorkSummary `json:"items"`
	Next  string        `json:"next,omitempty"`
}

// BatchRequest is the body of POST /v1/batches.
type BatchRequest struct {
	Contract string `json:"contract"`
	// BatchKey, when set, makes the request idempotent: the same key (for
	// the same tenant) names the same batch, and asking again with the
	// same items returns it; with other items it is refused.
	BatchKey string `json:"batchKey,omitempty"`
	// DeadlineSeconds is every item's deadline; default the batch lane's.
	DeadlineSeconds int                `json:"deadlineSeconds,omitempty"`
	Items           []BatchItemRequest `json:"items"`
}

// BatchItemRequest is one item of a batch. SourceID defaults to ItemID and
// Revision to a digest of the input, so the ingress fence makes the same
// item with the same input the same work, and a changed input a new
// revision that supersedes the older one.
type BatchItemRequest struct {
	ItemID   string          `json:"itemId"`
	SourceID string          `json:"sourceId,omitempty"`
	Revision string          `json:"revision,omitempty"`
	Input    json.RawMessage `json:"input"`
}

// BatchResponse answers POST /v1/batches.
type BatchResponse struct {
	BatchID   string          `json:"batchId"`
	Contract  string          `json:"contract"`
	Total     int             `json:"total"`
	Duplicate bool            `json:"duplicate"`
	Region    string          `json:"region"`
	Items     []BatchItemWork `json:"items,omitempty"`
	Links     BatchLinks      `json:"links"`
}

// BatchItemWork is the work an item became.
type BatchItemWork struct {
	ItemID string `json:"itemId"`
	WorkID string `json:"workId"`
	State  string `json:"state"`
	// Existing says the ingress fence found the item's work accepted
	// already (by an earlier batch or a submission).
	Existing bool `json:"existing"`
}

// BatchLinks point at a batch's resources.
type BatchLinks struct {
	Self    string `json:"self"`
	Results string `json:"results"`
	Events  string `json:"events"`
	Cancel  string `json:"cancel"`
}

// BatchView answers GET /v1/batches/{id}. Total is the manifest's item
// count, and Accepted + Failed + Pending + Missing always add up to it: an
// item that has no result is named in FailedItems or PendingItems, never
// left out.
type BatchView struct {
	BatchID    string         `json:"batchId"`
	Contract   string         `json:"contract"`
	Total      int            `json:"total"`
	Counts     map[string]int `json:"counts"`
	Accepted   int            `json:"accepted"`
	Failed     int            `json:"failed"`
	Pending    int            `json:"pending"`
	Missing    int            `json:"missing"`
	Complete   bool           `json:"complete"`
	Canceled   bool           `json:"canceled"`
	CanceledAt *time.Time     `json:"canceledAt,omitempty"`
	DeadlineAt time.Time      `json:"deadlineAt"`
	CreatedAt  time.Time      `json:"createdAt"`
	// FailedItems are items that ended without being accepted, with their
	// outcome and reason; PendingItems those with no outcome yet. Each
	// lists at most 1000; Truncated says a list was cut (the results
	// stream has them all).
	FailedItems  []BatchItemView `json:"failedItems"`
	PendingItems []BatchItemView `json:"pendingItems"`
	Truncated    bool            `json:"truncated,omitempty"`
	// CanceledItems, in the answer to a cancel, is how many items the
	// cancel ended.
	CanceledItems *int       `json:"canceledItems,omitempty"`
	Links         BatchLinks `json:"links"`
}

// BatchItemView is one item as it stands; in the results stream one line.
type BatchItemView struct {
	ItemID  string          `json:"itemId"`
	WorkID  string          `json:"workId"`
	State   string          `json:"state"`
	Outcome *string         `json:"outcome"`
	Reason  string          `json:"reason,omitempty"`
	Output  json.RawMessage `json:"output,omitempty"`
}

// WorkEvent is the data of one event of GET /v1/work/{id}/events. Event
// names: queued (the work is in the queue, again after a re-run),
// running (attempt Attempt began), attempt (attempt Attempt ended with
// Outcome), the work's outcome word when it ends (accepted,
// schema_rejected, retry_exhausted, canceled, …), review (it entered the
// human review queue) and resolved (a person resolved that item).
type WorkEvent struct {
	WorkID    string          `json:"workId"`
	State     string          `json:"state,omitempty"`
	Attempt   int             `json:"attempt,omitempty"`
	AttemptID string          `json:"attemptId,omitempty"`
	Outcome   string          `json:"outcome,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Output    json.RawMessage `json:"output,omitempty"`
	ReviewID  string          `json:"reviewId,omitempty"`
	Verdict   string          `json:"verdict,omitempty"`
	By        string          `json:"by,omitempty"`
	At        *time.Time      `json:"at,omitempty"`
}

// BatchEvent is the data of one event of GET /v1/batches/{id}/events.
// Event names: queued (the batch, first of all), an item's outcome word
// when it ends (accepted, schema_rejected, canceled, …), canceled (the
// batch was canceled) and complete (every item has its outcome). Ended is
// how many items had ended by this event.
type BatchEvent struct {
	BatchID string     `json:"batchId"`
	ItemID  string     `json:"itemId,omitempty"`
	WorkID  string     `json:"workId,omitempty"`
	Outcome string     `json:"outcome,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Ended   int        `json:"ended"`
	Total   int        `json:"total"`
	At      *time.Time `json:"at,omitempty"`
}

// WebhookResponse answers a delivery that maps to work.
type WebhookResponse struct {
	SubmitResponse
	Delivery string `json:"delivery"`
	// Reason is set when admission dropped the work: why, and the command
	// that asks again.
	Reason string `json:"reason,omitempty"`
}

// IgnoredResponse answers a delivery that asks for no work.
type IgnoredResponse struct {
	Ignored string `json:"ignored"`
}

// ReviewView is one item of the human review queue.
type ReviewView struct {
	ReviewID   string `json:"reviewId"`
	WorkID     string `json:"workId"`
	TenantID   string `json:"tenantId"`
	Contract   string `json:"contract"`
	Lane       string `json:"lane"`
	Reason     string `json:"reason"`
	State      string `json:"state"`
	WorkState  string `json:"workState"`
	WorkReason string `json:"workReason,omitempty"`
	// SourceID and Revision are what the work is about: a pull request's
	// owner/repo#number and head SHA, or the caller's own source id.
	SourceID string `json:"sourceId"`
	Revision string `json:"revision"`
	// Verdict is a person's (approved, amended, rejected, dismissed), or
	// closed: the system closed the item because its work was settled by
	// another ending, which Note names.
	Verdict    string `json:"verdict,omitempty"`
	ResolvedBy string `json:"resolvedBy,omitempty"`
	// Resolver is who resolved the item, as the credential of the request
	// said, and through which route (kind and route system for an item the
	// system closed); absent for an item resolved before resolvers were
	// recorded, whose ResolvedBy is the name its request gave.
	Resolver *Actor `json:"resolver,omitempty"`
	// Resolution says it in a sentence: "approved by tenant acme via the
	// API", "amended by reviewer ana via the console", "closed by the
	// system: the work was redriven and its answer was accepted".
	Resolution string     `json:"resolution,omitempty"`
	Note       string     `json:"note,omitempty"`
	ResolvedAt *time.Time `json:"resolvedAt,omitempty"`
	// HeldBy is the person (an operator token's name, of kind HeldByKind)
	// who holds the open item from the console, until HeldUntil; absent
	// when nobody does.
	HeldBy     string     `json:"heldBy,omitempty"`
	HeldByKind string     `json:"heldByKind,omitempty"`
	HeldUntil  *time.Time `json:"heldUntil,omitempty"`
	// Published says the item was resolved with an answer that the work
	// publishes as its reviewed outcome.
	Published bool      `json:"published,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	Links     Links     `json:"links"`
}

// ReviewList answers GET /v1/reviews; Next, when set, is the cursor of the
// next page.
type ReviewList struct {
	Items []ReviewView `json:"items"`
	Next  string       `json:"next,omitempty"`
}

// ResolveRequest is the body of POST /v1/reviews/{id}/resolve. Who
// resolves is the token's tenant, recorded as resolved by tenant <id> via
// the API.
type ResolveRequest struct {
	// By is refused, whatever it holds (400 invalid_resolver). It was once
	// a free-text name, stored as it came, so a tenant could resolve in an
	// operator's name; a client that still sends it learns so rather than
	// having it dropped without a word.
	By      json.RawMessage `json:"by,omitempty"`
	Verdict string          `json:"verdict"`
	Note    string          `json:"note,omitempty"`
}

// ActionRequest is the body of POST /v1/console/work/{id}/actions.
type ActionRequest struct {
	// Action is redrive (work that ended in a failed outcome), rerun (work
	// admission dropped) or cancel (work not ended yet).
	Action string `json:"action"`
	// Confirm repeats the work's id: the page asks the person to type it.
	Confirm string `json:"confirm"`
	Note    string `json:"note,omitempty"`
}

// ActionResponse answers an action taken.
type ActionResponse struct {
	WorkID string `json:"workId"`
	Action string `json:"action"`
	State  string `json:"state"`
	By     string `json:"by"`
}
