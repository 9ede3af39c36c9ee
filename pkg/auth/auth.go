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
	// ServedBy, when set, says which cell of the region serves a tenant
	// (the region's placement map); an error means it cannot say yet. Nil
	// checks the region alone.
	ServedBy func(tenant string) (string, error)
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

// Operators resolves operator tokens: the cell-wide credentials of the
// console, which are no tenant's.
type Operators interface {
	OperatorByToken(ctx context.Context, token string) (store.Operator, error)
}

// Bearer authenticates a request by its "Authorization: Bearer <token>"
// header and admits its tenant to cell: 401 for a missing, unknown or
// revoked token, 403 operator_token for an operator's (when tenants also
// resolves those), then Admit's refusals, 503 when the database does not
// answer (the only refusal worth retrying).
func Bearer(ctx context.Context, tenants Tenants, header string, cell Cell) (store.Tenant, *apierror.Error) {
	tok, refused := bearerToken(header)
	if refused != nil {
		return store.Tenant{}, refused
	}
	t, err := tenants.TenantByToken(ctx, tok)
	if errors.Is(err, store.ErrNotFound) {
		if ops, ok := tenants.(Operators); ok {
			if _, err := ops.OperatorByToken(ctx, tok); err == nil {
				return store.Tenant{}, operatorRefused()
			} else if !errors.Is(err, store.ErrNotFound) {
				return store.Tenant{}, Unavailable()
			}
		}
		return store.Tenant{}, unknownToken()
	}
	if err != nil {
		return store.Tenant{}, Unavailable()
	}
	if r := Admit(t, cell); r != nil {
		// The tenant goes with a refusal of its cell, so the caller can
		// send the request on to the one that serves it.
		if r.Code != "wrong_cell" {
			t = store.Tenant{}
		}
		return t, r
	}
	return t, nil
}

func bearerToken(header string) (string, *apierror.Error) {
	tok, ok := strings.CutPrefix(header, "Bearer ")
	if tok = strings.TrimSpace(tok); !ok || tok == "" {
		return "", apierror.New(http.StatusUnauthorized, "unauthenticated", "send an API token as 'Authorization: Bearer <token>'")
	}
	return tok, nil
}

func unknownToken() *apierror.Error {
	return apierror.New(http.StatusUnauthorized, "unauthenticated", "unknown or revoked API token")
}

func operatorRefused() *apierror.Error {
	return apierror.New(http.StatusForbidden, "operator_token",
		"this is an operator token: it reads the console; tenant APIs take a tenant's token")
}

// Viewer is who reads the console: a tenant, which sees its own figures
// alone, or an operator, who sees the whole cell's. Exactly one is set.
type Viewer struct {
	Tenant   *store.Tenant
	Operator *store.Operator
}

// Key names the credential's holder, to count what it holds open.
func (v Viewer) Key() string {
	if v.Operator != nil {
		return "operator:" + v.Operator.Name
	}
	return "tenant:" + v.Tenant.ID
}

// Credentials resolve both kinds of token.
type Credentials interface {
	Tenants
	Operators
}

// Console authenticates a reader of the console: a tenant's token, admitted
// to cell as Bearer admits it (403 suspended, 421 another cell's), or an
// operator's; 401 for a missing, unknown or revoked token.
func Console(ctx context.Context, creds Credentials, header string, cell Cell) (Viewer, *apierror.Error) {
	tok, refused := bearerToken(header)
	if refused != nil {
		return Viewer{}, refused
	}
	t, err := creds.TenantByToken(ctx, tok)
	switch {
	case err == nil:
		if r := Admit(t, cell); r != nil {
			if r.Code == "wrong_cell" {
				return Viewer{Tenant: &t}, r
			}
			return Viewer{}, r
		}
		return Viewer{Tenant: &t}, nil
	case !errors.Is(err, store.ErrNotFound):
		return Viewer{}, Unavailable()
	}
	o, err := creds.OperatorByToken(ctx, tok)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return Viewer{}, unknownToken()
	case err != nil:
		return Viewer{}, Unavailable()
	}
	return Viewer{Operator: &o}, nil
}

// Admit checks a tenant found by its credential or by a webhook's link:
// 403 when it is suspended, 421 naming its home region when another cell
// serves it.
func Admit(t store.Tenant, cell Cell) *apierror.Error {
	if t.Status != store.TenantActive {
		return apierror.New(http.StatusForbidden, "tenant_suspended", fmt.Sprintf("tenant %s is suspended", t.ID))
	}
	if t.HomeRegion != cell.Region {
		return apierror.New(http.StatusMisdirectedRequest, "wrong_region",
			fmt.Sprintf("tenant %s is homed in region %s; send this request to the %s cell, this is %s",
				t.ID, t.HomeRegion, HomeCell(t), cell.id()))
	}
	if cell.ServedBy == nil {
		return nil
	}
	serving, err := cell.ServedBy(t.ID)
	if err != nil {
		return apierror.New(http.StatusServiceUnavailable, "unavailable", err.Error())
	}
	if serving != cell.id() {
		return WrongCell(t.ID, serving, cell)
	}
	return nil
}

// WrongCell is the refusal of a tenant another cell of the same region
// serves: 421 wrong_cell, naming that cell.
func WrongCell(tenant, serving string, cell Cell) *apierror.Error {
	return apierror.New(http.StatusMisdirectedRequest, "wrong_cell",
		fmt.Sprintf("tenant %s is served by cell %s of region %s; send this request to it, this is %s", tenant, serving, cell.Region, cell.id()))
}

// Unavailable is the refusal when the cell's database did not answer.
func Unavailable() *apierror.Error {
	return apierror.New(http.StatusServiceUnavailable, "unavailable", "the cell's database did not answer; try again")
}
