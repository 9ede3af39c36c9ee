// Package console is the console's figures and work pages: the cell's
// snapshot and its stream (GET /v1/console, GET /v1/console/events), a
// work item's story and the operator's actions on it, and the pages that
// show them.
package console

import (
	"net/http"

	"assay.dev/services/ingress/internal/door"
)

// Room serves the console through the door.
type Room struct {
	*door.Door
	// shared is the console streams' last snapshot per scope.
	shared consoleShared
}

// Endpoints are the console's operations and pages.
func (s *Room) Endpoints() []door.Endpoint {
	return []door.Endpoint{
		{Pattern: "GET /console", Handler: http.HandlerFunc(s.consolePage)},
		{Pattern: "GET /v1/console", Handler: http.HandlerFunc(s.consoleSnapshot)},
		{Pattern: "GET /v1/console/events", Handler: http.HandlerFunc(s.consoleEvents)},
		{Pattern: "GET /v1/console/work/{id}", Handler: http.HandlerFunc(s.consoleWork)},
		{Pattern: "POST /v1/console/work/{id}/actions", Handler: http.HandlerFunc(s.consoleAct)},
		{Pattern: "GET /console/work/{id}", Handler: http.HandlerFunc(s.consoleWorkPage)},
	}
}
