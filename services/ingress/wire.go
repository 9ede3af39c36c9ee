package ingress

import (
	"context"
	"time"

	"assay.dev/pkg/api"
	"assay.dev/pkg/event"
	"assay.dev/pkg/outbox"
	"assay.dev/pkg/store"
	"assay.dev/pkg/story"
	"assay.dev/services/ingress/internal/console"
	"assay.dev/services/ingress/internal/desk"
	"assay.dev/services/ingress/internal/webhook"
)

// The HTTP API's request and answer types are package api's, which the
// operator's tool and other clients share; ingress names them as its own.
type (
	SubmitRequest    = api.SubmitRequest
	SubmitResponse   = api.SubmitResponse
	Links            = api.Links
	WorkView         = api.WorkView
	WorkReview       = api.WorkReview
	AttemptView      = api.AttemptView
	PublicationView  = api.PublicationView
	ResultView       = api.ResultView
	WorkSummary      = api.WorkSummary
	WorkList         = api.WorkList
	WorkEvent        = api.WorkEvent
	BatchEvent       = api.BatchEvent
	WebhookResponse  = api.WebhookResponse
	IgnoredResponse  = api.IgnoredResponse
	BatchRequest     = api.BatchRequest
	BatchItemRequest = api.BatchItemRequest
	BatchResponse    = api.BatchResponse
	BatchItemWork    = api.BatchItemWork
	BatchLinks       = api.BatchLinks
	BatchView        = api.BatchView
	BatchItemView    = api.BatchItemView
	ReviewView       = api.ReviewView
	ReviewList       = api.ReviewList
	ResolveRequest   = api.ResolveRequest
	ActionRequest    = api.ActionRequest
	ActionResponse   = api.ActionResponse
)

// A work's story is package story's, which the operator's tool reads too.
type (
	WorkRow      = story.WorkRow
	AttemptStory = story.AttemptStory
	Decision     = story.Decision
	WorkStory    = story.Story
	Answers      = story.Answers
	StoryStore   = story.Store
)

// How much of each kept answer a story shows.
const (
	AnswerNone  = story.AnswerNone
	AnswerShape = story.AnswerShape
	AnswerFull  = story.AnswerFull
)

// WorkID is api.WorkID: deterministic from the ingress key.
func WorkID(tenant, contractName, sourceID, revision string) string {
	return api.WorkID(tenant, contractName, sourceID, revision)
}

// ValidWorkID is api.ValidWorkID.
func ValidWorkID(id string) bool { return api.ValidWorkID(id) }

// Digest is api.Digest: the content digest of a work's input.
func Digest(input []byte) string { return api.Digest(input) }

// Sign is api.Sign: the X-Hub-Signature-256 value for body.
func Sign(secret string, body []byte) string { return api.Sign(secret, body) }

// VerifySignature is api.VerifySignature.
func VerifySignature(secret string, body []byte, header string) bool {
	return api.VerifySignature(secret, body, header)
}

// RepositoryPatternOK is api.RepositoryPatternOK.
func RepositoryPatternOK(p string) bool { return api.RepositoryPatternOK(p) }

// Announce is outbox.Announce: the outbox rows of newly queued work.
func Announce(ctx context.Context, n event.Names) func(*store.Work) ([]store.OutboxMsg, error) {
	return outbox.Announce(ctx, n)
}

// WorkMessage is outbox.WorkMessage: the outbox row that announces w.
func WorkMessage(ctx context.Context, n event.Names, w *store.Work, dispatch int) (store.OutboxMsg, error) {
	return outbox.WorkMessage(ctx, n, w, dispatch)
}

// WorkRowOf is story.WorkRowOf: w as an operator sees it.
func WorkRowOf(w *store.Work) WorkRow { return story.WorkRowOf(w) }

// ReadStory is story.Read.
func ReadStory(ctx context.Context, st StoryStore, id string, answers Answers) (*WorkStory, error) {
	return story.Read(ctx, st, id, answers)
}

// PublicationViews is story.PublicationViews.
func PublicationViews(ps []*store.Publication) []PublicationView { return story.PublicationViews(ps) }

func workReview(ctx context.Context, st StoryStore, id string) (*WorkReview, error) {
	return story.ReviewOf(ctx, st, id)
}

func reviewView(v *store.Review, now time.Time) ReviewView { return story.ReviewView(v, now) }

func reviewID(v *store.Review) string { return story.ReviewID(v) }

func resolution(v *store.Review) string { return story.Resolution(v) }

// The console's snapshot, as GET /v1/console answers it.
type Console = console.Console

// ConsoleRecent is how many recent items a console snapshot lists;
// ConsoleStates are the five states, in the order the console shows them.
const ConsoleRecent = console.ConsoleRecent

var ConsoleStates = console.ConsoleStates

// A review item as the review desk shows it, and a tenant's views.
type (
	ReviewCase = desk.ReviewCase
	ViewCounts = desk.ViewCounts
)

// The part of GitHub's pull_request event payload that ingress reads.
type (
	PullRequestEvent = webhook.PullRequestEvent
	PullRequest      = webhook.PullRequest
	GitRef           = webhook.GitRef
	Repository       = webhook.Repository
	Installation     = webhook.Installation
)

// WebhookContract is the contract a pull request's review is made for.
const WebhookContract = webhook.WebhookContract

// MaxBatchItems is the most items one batch holds.
const MaxBatchItems = api.MaxBatchItems
