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
