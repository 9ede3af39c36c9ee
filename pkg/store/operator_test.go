package store_test

import (
	"errors"
	"testing"

	"assay.dev/pkg/store"
)

// Operator tokens: one active per name, never a tenant's token, looked up
// by hash, refused once revoked.
func TestOperatorTokens(t *testing.T) {
	t.Parallel()
	s, ctx := setup(t)
	tok := store.NewToken()
	if err := s.AddOperatorToken(ctx, "ops", tok); err != nil {
		t.Fatal(err)
	}
	if o, err := s.OperatorByToken(ctx, tok); err != nil || o.Name != "ops" {
		t.Fatalf("lookup: %+v %v", o, err)
	}
	if _, err := s.TenantByToken(ctx, tok); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an operator token resolves to a tenant: %v", err)
	}
	if err := s.AddOperatorToken(ctx, "ops", store.NewToken()); !errors.Is(err, store.ErrExists) {
		t.Errorf("second active token for ops: %v, want ErrExists", err)
	}
	if err := s.AddOperatorToken(ctx, "other-ops", tok); !errors.Is(err, store.ErrExists) {
		t.Errorf("the same token for another name: %v, want ErrExists", err)
	}
	if err := s.AddOperatorToken(ctx, "sneaky", "tok-acme"); !errors.Is(err, store.ErrExists) {
		t.Errorf("a tenant's token as an operator's: %v, want ErrExists", err)
	}
	if err := s.AddOperatorToken(ctx, "Not A Name", store.NewToken()); err == nil {
		t.Error("a name with spaces and capitals was taken")
	}
	if err := s.RevokeOperatorToken(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OperatorByToken(ctx, tok); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoked token: %v, want ErrNotFound", err)
	}
	if err := s.RevokeOperatorToken(ctx, "ops"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoking again: %v, want ErrNotFound", err)
	}
	if err := s.AddOperatorToken(ctx, "ops", store.NewToken()); err != nil {
		t.Errorf("a new token after the revocation: %v", err)
	}
	list, err := s.OperatorTokens(ctx)
	if err != nil || len(list) != 2 || list[0].RevokedAt == nil || list[1].RevokedAt != nil {
		t.Errorf("list: %+v %v", list, err)
	}
}
