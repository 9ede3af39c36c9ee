package request

import (
	"net/http"
	"net/url"
	"strconv"
	"time"

	"assay.dev/pkg/apierror"
)

// Page reads a listing's limit (1 to 1000) into limit and the cursor it
// gave for the next page into at and id, each only when the query names
// it; false means it wrote the refusal. A cursor is the caller's bytes: one
// whose id is not text, or whose time no listing gave (Postgres keeps
// 4713 BC to 294276 AD, a listing years 1 to 9999), is refused like any
// other it did not give, before it reaches a query.
func Page(w http.ResponseWriter, q url.Values, parse func(string) (time.Time, string, error), limit *int, at *time.Time, id *string) bool {
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			apierror.Write(w, http.StatusBadRequest, "invalid_query", "limit: not a whole number from 1 to 1000")
			return false
		}
		*limit = n
	}
	if v := q.Get("cursor"); v != "" {
		t, i, err := parse(v)
		if err != nil || !storable(i) || t.Year() < 1 || t.Year() > 9999 {
			apierror.Write(w, http.StatusBadRequest, "invalid_query", "cursor: not a cursor this listing gave")
			return false
		}
		*at, *id = t, i
	}
	return true
}
