package door

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/placement"
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
func (s *Door) RegisterCell(ctx context.Context, url string) error {
	return s.place.Register(ctx, url)
}

// holdWait bounds how long a request of a tenant whose history is being
// copied to another cell (the cut of a move, placement.PhaseCut) is held
// before it is refused 503: the cut takes a moment, and every request
// that arrives during it is answered once it is over, by the cell that
// serves the tenant then.
const holdWait = 20 * time.Second

// serving is the cell of this region that serves tenant, as the region's
// placement map says; an error while the map is not read. During a move's
// cut it waits for the cut to end, up to holdWait.
func (s *Door) serving(tenant string) (string, error) {
	deadline := time.Now().Add(holdWait)
	for {
		snap, err := s.place.Now()
		if err != nil {
			return "", err
		}
		cell, err := snap.Serving(tenant)
		var moving *placement.ErrMoving
		if !errors.As(err, &moving) || time.Now().After(deadline) {
			return cell, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// finishing reports whether r was sent on by the cell that serves tenant
// now, for work this cell admitted before the tenant moved there and
// still finishes: this cell answers it.
func (s *Door) finishing(r *http.Request, tenant string) bool {
	by := r.Header.Get(ForwardedBy)
	if by == "" {
		return false
	}
	snap, err := s.place.Now()
	return err == nil && snap.Finishing(tenant, s.Cfg.Names.Cell, by)
}

// SendToFinisher answers a request about work this cell holds for the
// cell that finishes it (a tenant moved here, its work admitted before
// the move not ended there yet) with that cell's answer; reports false
// when the work is not held for another cell.
func (s *Door) SendToFinisher(w http.ResponseWriter, r *http.Request, tenant, workID string, body []byte) bool {
	cell, err := s.D.Store.HeldIn(r.Context(), workID)
	if err != nil || cell == "" || r.Header.Get(ForwardedBy) != "" {
		return false
	}
	s.sendTo(w, r, tenant, cell, apierror.New(http.StatusServiceUnavailable, "unavailable",
		fmt.Sprintf("work %s is finished by cell %s, which did not answer; try again", workID, cell)), body)
	return true
}

// MovedOut answers a request whose work the database refused because the
// tenant moved out of this cell (a request admitted just before the cut):
// it is sent on to the cell that serves the tenant once the map says so.
func (s *Door) MovedOut(w http.ResponseWriter, r *http.Request, tenant string, body []byte) {
	refused := apierror.New(http.StatusServiceUnavailable, "unavailable",
		fmt.Sprintf("tenant %s is moving to another cell of the region; try again", tenant))
	if cell, err := s.serving(tenant); err == nil && cell != s.Cfg.Names.Cell {
		s.sendTo(w, r, tenant, cell, refused, body)
		return
	}
	refused.Write(w)
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
func (s *Door) sendOn(w http.ResponseWriter, r *http.Request, tenant string, refused *apierror.Error, body []byte) {
	cell := ""
	if snap, err := s.place.Now(); err == nil {
		cell = snap.CellOf(tenant)
	}
	s.sendTo(w, r, tenant, cell, refused, body)
}

// sendTo sends r on to cell, as sendOn does.
func (s *Door) sendTo(w http.ResponseWriter, r *http.Request, tenant, cell string, refused *apierror.Error, body []byte) {
	var target *url.URL
	if snap, err := s.place.Now(); err == nil && r.Header.Get(ForwardedBy) == "" && cell != "" {
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
	from := s.Cfg.Names.Cell
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
			s.D.Log.Warn("a request for another cell of the region was not answered there", "tenant", tenant, "cell", cell,
				"url", target.String(), "err", err)
			apierror.Write(w, http.StatusMisdirectedRequest, refused.Code,
				refused.Message+"; cell "+cell+" did not answer through this cell")
		},
	}
	proxy.ServeHTTP(w, r)
}

// RefuseOrSendOn writes refused, or, when it is the refusal of a tenant
// another cell serves, sends the request on to that cell.
func (s *Door) RefuseOrSendOn(w http.ResponseWriter, r *http.Request, t store.Tenant, refused *apierror.Error, body []byte) {
	if refused.Code == "wrong_cell" && t.ID != "" {
		s.sendOn(w, r, t.ID, refused, body)
		return
	}
	refused.Write(w)
}
