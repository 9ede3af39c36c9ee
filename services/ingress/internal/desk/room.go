// Package desk is the review queue: a tenant's open review items and its
// views through the API (GET /v1/reviews, POST /v1/reviews/{id}/resolve,
// GET /v1/views), and the console's review desk, where a person claims an
// item, reads its diff with each finding in place and resolves it, the
// answer held to the committer's gate (pkg/gate) before it is taken.
package desk

import (
	"net/http"

	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
)

// Room serves the review queue through the door.
type Room struct{ *door.Door }

// Endpoints are the review queue's operations and its page. Each whose
// query reaches the database is wrapped in request.TextQuery.
func (s *Room) Endpoints() []door.Endpoint {
	return []door.Endpoint{
		{Pattern: "GET /v1/reviews", Handler: request.TextQuery(http.HandlerFunc(s.listReviews))},
		{Pattern: "POST /v1/reviews/{id}/resolve", Handler: http.HandlerFunc(s.resolveReview)},
		{Pattern: "GET /v1/views", Handler: request.TextQuery(http.HandlerFunc(s.views))},
		{Pattern: "GET /v1/console/reviews", Handler: request.TextQuery(http.HandlerFunc(s.consoleReviews))},
		{Pattern: "GET /v1/console/reviews/{id}", Handler: http.HandlerFunc(s.consoleReview)},
		{Pattern: "POST /v1/console/reviews/{id}/claim", Handler: http.HandlerFunc(s.consoleClaim)},
		{Pattern: "POST /v1/console/reviews/{id}/resolve", Handler: http.HandlerFunc(s.consoleResolve)},
		{Pattern: "GET /console/reviews", Handler: http.HandlerFunc(s.consoleReviewPage)},
	}
}
