// Package batches is batches of work (POST /v1/batches, a batch's view,
// results and cancelling) and the event streams of a work item or a batch
// (GET /v1/work/{id}/events, GET /v1/batches/{id}/events), which resume
// where a client's last event left off.
package batches

import (
	"net/http"

	"assay.dev/services/ingress/internal/door"
)

// Room serves batches and event streams through the door.
type Room struct{ *door.Door }

// Endpoints are the batch API's operations and the event streams.
func (s *Room) Endpoints() []door.Endpoint {
	return []door.Endpoint{
		{Pattern: "GET /v1/work/{id}/events", Handler: http.HandlerFunc(s.workEventStream)},
		{Pattern: "POST /v1/batches", Handler: http.HandlerFunc(s.submitBatch)},
		{Pattern: "GET /v1/batches/{id}", Handler: http.HandlerFunc(s.getBatch)},
		{Pattern: "GET /v1/batches/{id}/results", Handler: http.HandlerFunc(s.batchResults)},
		{Pattern: "GET /v1/batches/{id}/events", Handler: http.HandlerFunc(s.batchEventStream)},
		{Pattern: "POST /v1/batches/{id}/cancel", Handler: http.HandlerFunc(s.cancelBatch)},
		{Pattern: "DELETE /v1/batches/{id}", Handler: http.HandlerFunc(s.cancelBatch)},
	}
}
