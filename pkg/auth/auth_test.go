package auth

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"assay.dev/pkg/store"
)

type tenants map[string]store.Tenant

func (ts tenants) TenantByToken(_ context.Context, tok string) (store.Tenant, error) {
	if tok == "broken" {
		return store.Tenant{}, errors.New("connection refused")
	}
	t, ok := ts[tok]
	if !ok {
		return store.Tenant{}, store.ErrNotFound
	}
	return t, nil
}

func TestBearer(t *testing.T) {
	t.Parallel()
	ts := tenants{
		"tok-acme":    {ID: "acme", HomeRegion: "us", Status: store.TenantActive},
		"tok-globex":  {ID: "globex", HomeRegion: "eu", Status: store.TenantActive},
		"tok-initech": {ID: "initech", HomeRegion: "us", Status: store.TenantSuspended},
	}
	us := Cell{Region: "us"}
	cases := []struct {
		name, header string
		status       int
		code, names  string
	}{
		{"acme at home", "Bearer tok-acme", 0, "", ""},
		{"padded token", "Bearer  tok-acme ", 0, "", ""},
		{"no header", "", http.StatusUnauthorized, "unauthenticated", ""},
		{"basic auth", "Basic dXNlcjpwYXNz", http.StatusUnauthorized, "unauthenticated", ""},
		{"empty bearer", "Bearer ", http.StatusUnauthorized, "unauthenticated", ""},
		{"unknown token", "Bearer nope", http.StatusUnauthorized, "unauthenticated", ""},
		{"database down", "Bearer broken", http.StatusServiceUnavailable, "unavailable", ""},
		{"suspended tenant", "Bearer tok-initech", http.StatusForbidden, "tenant_suspended", "initech"},
		{"tenant homed in eu", "Bearer tok-globex", http.StatusMisdirectedRequest, "wrong_region", "region eu"},
	}
	for _, c := range cases {
		got, r := Bearer(context.Background(), ts, c.header, us)
		if c.status == 0 {
			if r != nil || got.ID != "acme" {
				t.Errorf("%s: %v %+v", c.name, r, got)
			}
			continue
		}
		if r == nil || r.Status != c.status || r.Code != c.code || !strings.Contains(r.Message, c.names) {
			t.Errorf("%s: %+v, want %d %s naming %q", c.name, r, c.status, c.code, c.names)
			continue
		}
		if got.ID != "" {
			t.Errorf("%s: a refusal still named tenant %q", c.name, got.ID)
		}
	}
}

func TestRefusalWritesJSON(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	Admit(store.Tenant{ID: "globex", HomeRegion: "eu", Status: store.TenantActive}, Cell{Region: "us"}).Write(rec)
	if rec.Code != http.StatusMisdirectedRequest || rec.Header().Get("Content-Type") != "application/json" ||
		!strings.Contains(rec.Body.String(), `"code":"wrong_region"`) {
		t.Fatalf("%d %s %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
}

// credentials resolve tenants' tokens and operators' tokens.
type credentials struct {
	tenants
	operators map[string]string
}

func (c credentials) OperatorByToken(_ context.Context, tok string) (store.Operator, error) {
	if tok == "broken-operator" {
		return store.Operator{}, errors.New("connection refused")
	}
	name, ok := c.operators[tok]
	if !ok {
		return store.Operator{}, store.ErrNotFound
	}
	return store.Operator{Name: name}, nil
}

func testCredentials() credentials {
	return credentials{
		tenants: tenants{
			"tok-acme":    {ID: "acme", HomeRegion: "us", Status: store.TenantActive},
			"tok-globex":  {ID: "globex", HomeRegion: "eu", Status: store.TenantActive},
			"tok-initech": {ID: "initech", HomeRegion: "us", Status: store.TenantSuspended},
		},
		operators: map[string]string{"tok-ops": "ops"},
	}
}

// The console admits a tenant (its own view) or an operator (the cell's);
// a tenant is refused as the tenant APIs refuse it.
func TestConsole(t *testing.T) {
	t.Parallel()
	creds := testCredentials()
	us := Cell{Region: "us"}
	cases := []struct {
		name, header string
		status       int
		code, key    string
	}{
		{"tenant", "Bearer tok-acme", 0, "", "tenant:acme"},
		{"operator", "Bearer tok-ops", 0, "", "operator:ops"},
		{"no header", "", http.StatusUnauthorized, "unauthenticated", ""},
		{"unknown token", "Bearer nope", http.StatusUnauthorized, "unauthenticated", ""},
		{"database down", "Bearer broken", http.StatusServiceUnavailable, "unavailable", ""},
		{"operator lookup down", "Bearer broken-operator", http.StatusServiceUnavailable, "unavailable", ""},
		{"suspended tenant", "Bearer tok-initech", http.StatusForbidden, "tenant_suspended", ""},
		{"tenant homed in eu", "Bearer tok-globex", http.StatusMisdirectedRequest, "wrong_region", ""},
	}
	for _, c := range cases {
		v, r := Console(context.Background(), creds, c.header, us)
		if c.status == 0 {
			if r != nil || v.Key() != c.key || (v.Tenant == nil) == (v.Operator == nil) {
				t.Errorf("%s: %v %+v, want %s", c.name, r, v, c.key)
			}
			continue
		}
		if r == nil || r.Status != c.status || r.Code != c.code || v.Tenant != nil || v.Operator != nil {
			t.Errorf("%s: %+v %+v, want %d %s", c.name, r, v, c.status, c.code)
		}
	}
}

// An operator token on a tenant API is told what it is; without a way to
// resolve operators it is just unknown.
func TestBearerRefusesOperatorToken(t *testing.T) {
	t.Parallel()
	creds := testCredentials()
	if _, r := Bearer(context.Background(), creds, "Bearer tok-ops", Cell{Region: "us"}); r == nil ||
		r.Status != http.StatusForbidden || r.Code != "operator_token" {
		t.Errorf("operator token: %+v, want 403 operator_token", r)
	}
	if _, r := Bearer(context.Background(), creds, "Bearer broken-operator", Cell{Region: "us"}); r == nil ||
		r.Status != http.StatusServiceUnavailable {
		t.Errorf("operator lookup down: %+v, want 503", r)
	}
	if _, r := Bearer(context.Background(), creds.tenants, "Bearer tok-ops", Cell{Region: "us"}); r == nil ||
		r.Status != http.StatusUnauthorized {
		t.Errorf("operator token without operators: %+v, want 401", r)
	}
	if got, r := Bearer(context.Background(), creds, "Bearer tok-acme", Cell{Region: "us"}); r != nil || got.ID != "acme" {
		t.Errorf("tenant token: %+v %+v", got, r)
	}
}
