// Package webhook is GitHub's front door: a pull_request delivery
// (POST /v1/webhooks/github) verified by its signature, bound to the tenant
// that linked its repository, its diff read, and its review queued once,
// however often GitHub delivers it.
package webhook

import (
	"net/http"

	"assay.dev/services/ingress/internal/door"
)

// Room serves GitHub's webhook through the door.
type Room struct{ *door.Door }

// Endpoints are the webhook's one operation.
func (s *Room) Endpoints() []door.Endpoint {
	return []door.Endpoint{
		{Pattern: "POST /v1/webhooks/github", Handler: http.HandlerFunc(s.githubWebhook)},
	}
}
