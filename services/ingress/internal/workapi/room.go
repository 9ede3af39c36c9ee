// Package workapi is the work API: a work item submitted, read and listed
// (POST /v1/work, GET /v1/work/{id}, GET /v1/work), and the console's
// search of the cell's work (GET /v1/console/work).
package workapi

import (
	"net/http"

	"assay.dev/services/ingress/internal/door"
	"assay.dev/services/ingress/internal/request"
)

// Room serves the work API through the door.
type Room struct{ *door.Door }

// Endpoints are the work API's operations. Each whose query reaches the
// database (filters, cursors) is wrapped in request.TextQuery.
func (s *Room) Endpoints() []door.Endpoint {
	return []door.Endpoint{
		{Pattern: "POST /v1/work", Handler: http.HandlerFunc(s.submit)},
		{Pattern: "GET /v1/work/{id}", Handler: http.HandlerFunc(s.get)},
		{Pattern: "GET /v1/work", Handler: request.TextQuery(http.HandlerFunc(s.list))},
		{Pattern: "GET /v1/console/work", Handler: request.TextQuery(http.HandlerFunc(s.consoleFind))},
	}
}
