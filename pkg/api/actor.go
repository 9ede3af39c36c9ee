package api

import "slices"

// Actor kinds: whose credential an act on a work item was made with.
// work_actions and reviews allow the same words.
const (
	// ActorTenant is a tenant's token; the actor's id is the tenant's.
	ActorTenant = "tenant"
	// ActorReviewer is an operator token of role reviewer; the id is its
	// name.
	ActorReviewer = "reviewer"
	// ActorOperator is an operator token of role operator; the id is its
	// name.
	ActorOperator = "operator"
)

// ActorKinds lists every actor kind.
var ActorKinds = []string{ActorTenant, ActorReviewer, ActorOperator}

// Routes an act comes through.
const (
	// RouteAPI is the tenant API (POST /v1/reviews/{id}/resolve).
	RouteAPI = "api"
	// RouteConsole is the console and its review screen.
	RouteConsole = "console"
)

// Routes lists every route.
var Routes = []string{RouteAPI, RouteConsole}

// Actor is who did something to a work item and the route it came
// through. It is read from the credential of the request, never from its
// body, so a tenant cannot act in an operator's name.
type Actor struct {
	Kind  string `json:"kind"`
	ID    string `json:"id"`
	Route string `json:"route"`
}

// String is the actor as a sentence names it: "tenant acme via the API",
// "reviewer ana via the console".
func (a Actor) String() string {
	via := a.Route
	switch a.Route {
	case RouteAPI:
		via = "the API"
	case RouteConsole:
		via = "the console"
	}
	return a.Kind + " " + a.ID + " via " + via
}

// Valid reports whether a names a kind, an id and a route.
func (a Actor) Valid() bool {
	return slices.Contains(ActorKinds, a.Kind) && a.ID != "" && slices.Contains(Routes, a.Route)
}
