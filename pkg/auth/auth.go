// Package auth is the one tenant authentication of every HTTP entry point:
// a credential names a tenant, and a tenant is served only while it is
// active and only by the cell that is its home. Every cell knows every
// tenant and its one credential, so a request sent to the wrong cell is
// refused with the home region named, never served or forwarded.
package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"assay.dev/pkg/apierror"
	"assay.dev/pkg/store"
)

// Tenants resolves credentials to tenants.
type Tenants interface {
	TenantByToken(ctx context.Context, token string) (store.Tenant, error)
}

// Cell is the cell that authenticates: the region it serves and its id.
type Cell struct {
	Region string
	// ID is the cell's id; it defaults to Region.
	ID string
}

func (c Cell) id() string {
	if c.ID == "" {
		return c.Region
	}
	return c.ID
}

// HomeCell is the cell that serves a tenant: the placement lookup, kept
// apart from the home region even while every region holds one cell, named
// after it.
func HomeCell(t store.Tenant) string { return t.HomeRegion }

// Bearer authenticates a request by its "Authorization: Bearer <token>"
// header and admits its tenant to cell: 401 for a missing, unknown or
// revoked token, then Admit's refusals, 503 when the database does not
// answer (the only refusal worth retrying).
func Bearer(ctx context.Context, tenants Tenants, header string, cell Cell) (store.Tenant, *apierror.Error) {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if tok = strings.TrimSpace(tok); !ok || tok == "" {
		return store.Tenant{}, apierror.New(http.StatusUnauthorized, "unauthenticated", "send an API token as 'Authorization: Bearer <token>'")
	}
	t, err := tenants.TenantByToken(ctx, tok)
	if errors.Is(err, store.ErrNotFound) {
		return store.Tenant{}, apierror.New(http.StatusUnauthorized, "unauthenticated", "unknown or revoked API token")
	}
	if err != nil {
		return store.Tenant{}, Unavailable()
	}
	if r := Admit(t, cell); r != nil {
		return store.Tenant{}, r
	}
	return t, nil
}

// Admit checks a tenant found by its credential or by a webhook's link:
// 403 when it is suspended, 421 naming its home region when another cell
// serves it.
func Admit(t store.Tenant, cell Cell) *apierror.Error {
	if t.Status != store.TenantActive {
		return apierror.New(http.StatusForbidden, "tenant_suspended", fmt.Sprintf("tenant %s is suspended", t.ID))
	}
	if t.HomeRegion != cell.Region || HomeCell(t) != cell.id() {
		return apierror.New(http.StatusMisdirectedRequest, "wrong_region",
			fmt.Sprintf("tenant %s is homed in region %s; send this request to the %s cell, this is %s",
				t.ID, t.HomeRegion, HomeCell(t), cell.id()))
	}
	return nil
}

// Unavailable is the refusal when the cell's database did not answer.
func Unavailable() *apierror.Error {
	return apierror.New(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; try again")
}
