package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/cmd/assay/internal/cell/celltest"
	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/evalset"
	"assay.dev/pkg/store"
)

// The operator's token commands, against a running cell: a created token
// reads the cell-wide console and nothing a tenant's token reads; it is
// stored hashed, never twice per name, never a tenant's; a revoked one is
// refused.
func TestOperatorTokenCommands(t *testing.T) {
	t.Parallel()
	b := celltest.Setup(t, cell.Options{})
	ctx := context.Background()
	db := b.Cell.Env.Config.DatabaseURL
	operator := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := operatorCmd(ctx, append(append([]string{"token"}, args...), "--region", "us", "--database-url", db), &out)
		return out.String(), err
	}
	console := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, b.Cell.URL+"/v1/console", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := b.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	out, err := operator("create", "--name", "oncall")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	m := regexp.MustCompile(`token \(shown once, stored hashed[^)]*\): (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("create printed no token: %q", out)
	}
	tok := m[1]
	if status := console(tok); status != http.StatusOK {
		t.Errorf("the new operator token on /v1/console: HTTP %d", status)
	}
	if status, raw := b.Post(t, tok, celltest.CodeReview(evalset.Items()[0], "operator")); status != http.StatusForbidden ||
		!strings.Contains(string(raw), `"operator_token"`) {
		t.Errorf("the operator token on POST /v1/work: HTTP %d %s, want 403 operator_token", status, raw)
	}
	if n := b.Count(t, `SELECT count(*) FROM operator_tokens WHERE token_hash = sha256($1::bytea)`, tok); n != 1 {
		t.Errorf("the token is not stored as its SHA-256 (%d rows)", n)
	}
	if n := b.Count(t, `SELECT count(*) FROM operator_tokens WHERE position(convert_to($1, 'UTF8') in token_hash) > 0`, tok); n != 0 {
		t.Errorf("token text found in storage")
	}
	if _, err := operator("create", "--name", "oncall"); err == nil || !strings.Contains(err.Error(), "active token") {
		t.Errorf("a second token for the same name: %v, want refused", err)
	}

	// A tenant's token cannot become an operator's.
	tenantFile := filepath.Join(t.TempDir(), "tenant-token")
	if err := os.WriteFile(tenantFile, []byte(b.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := operator("create", "--name", "sneaky", "--token-from", tenantFile); err == nil || !strings.Contains(err.Error(), "tenant") {
		t.Errorf("installing a tenant's token as an operator's: %v, want refused", err)
	}

	// Minted in one cell, installed in another: written to a file alone.
	file := filepath.Join(t.TempDir(), "operator-token")
	out, err = operator("create", "--name", "dashboard", "--token-out", file)
	if err != nil {
		t.Fatalf("create --token-out: %v", err)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	written := strings.TrimSpace(string(raw))
	if st, _ := os.Stat(file); st.Mode().Perm() != 0o600 || strings.Contains(out, written) {
		t.Errorf("--token-out: mode %v, printed %q", st.Mode().Perm(), out)
	}
	if status := console(written); status != http.StatusOK {
		t.Errorf("the written token on /v1/console: HTTP %d", status)
	}

	if out, err = operator("revoke", "--name", "oncall"); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	if status := console(tok); status != http.StatusUnauthorized {
		t.Errorf("the revoked token on /v1/console: HTTP %d, want 401", status)
	}
	if _, err := operator("revoke", "--name", "oncall"); err == nil {
		t.Error("revoking a name without an active token succeeded")
	}
	if _, err := operator("create", "--name", "oncall"); err != nil {
		t.Errorf("a new token after revoking the old: %v", err)
	}

	out, err = operator("list", "--json")
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var list []store.OperatorToken
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("list --json: %v: %s", err, out)
	}
	var names []string
	revoked := 0
	for _, l := range list {
		names = append(names, l.Name)
		if l.RevokedAt != nil {
			revoked++
		}
	}
	if strings.Join(names, ",") != "oncall,dashboard,oncall" || revoked != 1 {
		t.Errorf("list: %v with %d revoked, want oncall (revoked), dashboard, oncall", names, revoked)
	}
	if strings.Contains(out, tok) || strings.Contains(out, written) {
		t.Error("list shows a token")
	}
	if out, err := operator("list"); err != nil || !strings.Contains(out, "NAME") || !strings.Contains(out, "dashboard") {
		t.Errorf("list: %v %q", err, out)
	}

	for _, args := range [][]string{{"create"}, {"create", "--name", "Bad Name"}, {"rotate", "--name", "x"}, {"list", "extra"}} {
		var ce cli.ConfigError
		if _, err := operator(args...); !errors.As(err, &ce) {
			t.Errorf("operator token %v: %v, want a configuration error", args, err)
		}
	}
	var help bytes.Buffer
	if err := operatorCmd(ctx, []string{"--help"}, &help); err != nil || !strings.Contains(help.String(), "operator token") {
		t.Errorf("help: %v %q", err, help.String())
	}
}
