package ledger

import (
	"net/http"

	"assay.dev/pkg/auth"
	"assay.dev/pkg/usage"
)

// Handler serves GET /v1/usage from the cell's ledger (see package usage).
func (s *Service) Handler() http.Handler {
	return usage.Handler(s.d.Store, auth.Cell{Region: s.cfg.Region, ID: s.cfg.Names.Cell}, s.d.Log, nil)
}
