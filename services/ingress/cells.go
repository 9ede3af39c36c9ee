package ingress

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/store"
)

// ForwardedBy is the header a request sent on from another cell of the
// region carries, naming that cell. Such a request is never sent on again:
// a tenant the receiving cell does not serve either is refused there.
const ForwardedBy = "Assay-Forwarded-By"

// ServedBy is the header of an answer sent on from another cell of the
// region, naming the cell that answered.
const ServedBy = "Assay-Served-By"

// RegisterCell records url in the region's placement map as where this
// cell answers, for a cell that learns its address once it listens (the
// dev mode's and tests' cells on a free port); ASSAY_CELL_URL does it at
// the start.
func (s *Service) RegisterCell(ctx context.Context, url string) error {
	return s.place.Register(ctx, url)
}

// servedBy is the cell of this region that serves tenant, as the region's
// placement map says; an error while the map is not read, or while the
// tenant moves between cells (its requests are refused 503 meanwhile, for
// the few seconds the move holds them).
func (s *Service) servedBy(tenant string) (string, error) {
	snap, err := s.place.Now()
	if err != nil {
		return "", err
	}
	return snap.Serving(tenant)
}

// sendOn answers a request of a tenant that another cell of the region
// serves (refused says so: 421 wrong_cell) with that cell's answer to it,
// sent on through this one: the tenant's clients and its GitHub App need
// one address per region, whichever cell holds the tenant, and a tenant
// moved between cells keeps it. A request already sent on, or for a cell
// that has not registered where it answers, or that does not answer, gets
// the refusal, which names the cell and never its address or why it did
// not answer (the log has both). body, when not nil, is the request's body
// as read already.
func (s *Service) sendOn(w http.ResponseWriter, r *http.Request, tenant string, refused *apierror.Error, body []byte) {
	var cell string
	var target *url.URL
	if snap, err := s.place.Now(); err == nil && r.Header.Get(ForwardedBy) == "" {
		cell = snap.CellOf(tenant)
		if c, ok := snap.Cells[cell]; ok && c.URL != "" {
			target, _ = url.Parse(c.URL)
		}
	}
	if target == nil {
		refused.Write(w)
		return
	}
	if body != nil {
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	from := s.cfg.Names.Cell
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Header.Set(ForwardedBy, from)
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Set(ServedBy, cell)
			return nil
		},
		// Event streams are passed on as they are written.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(r.Context().Err(), err) || r.Context().Err() != nil {
				return // the caller went away
			}
			// The other cell's address and the dial error are the region's
			// own business: the log has them, the client is told the cell.
			s.d.Log.Warn("a request for another cell of the region was not answered there", "tenant", tenant, "cell", cell,
				"url", target.String(), "err", err)
			apierror.Write(w, http.StatusMisdirectedRequest, refused.Code,
				refused.Message+"; cell "+cell+" did not answer through this cell")
		},
	}
	proxy.ServeHTTP(w, r)
}

// moveWait bounds how long a GitHub delivery for a tenant being moved
// waits for the move to end: GitHub gives up on an answer after 10s, and
// does not deliver again by itself, so a delivery is held rather than
// refused for the few seconds a move holds the tenant.
const moveWait = 8 * time.Second

// awaitMove returns once tenant is not being moved between cells, or
// after moveWait.
func (s *Service) awaitMove(ctx context.Context, tenant string) {
	deadline := time.Now().Add(moveWait)
	for {
		snap, err := s.place.Now()
		if err != nil || snap.Moving[tenant] == "" || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// refuseOrSendOn writes refused, or, when it is the refusal of a tenant
// another cell serves, sends the request on to that cell.
func (s *Service) refuseOrSendOn(w http.ResponseWriter, r *http.Request, t store.Tenant, refused *apierror.Error, body []byte) {
	if refused.Code == "wrong_cell" && t.ID != "" {
		s.sendOn(w, r, t.ID, refused, body)
		return
	}
	refused.Write(w)
}
