package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Operator is who holds an operator token: a person or a dashboard that
// reads the whole cell's console, never a tenant.
type Operator struct {
	Name string `json:"name"`
	// Role is RoleOperator (reads the console, acts on work) or
	// RoleReviewer (reads it, acts on no work).
	Role string `json:"role"`
}

// The roles of an operator token.
const (
	RoleOperator = "operator"
	RoleReviewer = "reviewer"
)

// Roles are the roles an operator token can have.
var Roles = []string{RoleOperator, RoleReviewer}

// OperatorToken is an operator token as `assay operator token list` shows
// it; the token itself is never stored.
type OperatorToken struct {
	ID        int64      `json:"id"`
	Name      string     `json:"name"`
	Role      string     `json:"role"`
	CreatedAt time.Time  `json:"createdAt"`
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
}

var operatorNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidOperatorName reports whether name can name an operator token.
func ValidOperatorName(name string) bool { return operatorNameRE.MatchString(name) }

// AddOperatorToken stores token, hashed, as the operator name's. It fails
// with ErrExists when name already has an active token, or when token is
// already a credential here (an operator's or a tenant's): one token is
// never both.
func (s *Store) AddOperatorToken(ctx context.Context, name, token string) error {
	return s.AddOperatorTokenAs(ctx, name, RoleOperator, token)
}

// AddOperatorTokenAs is AddOperatorToken for a token of role (one of
// Roles).
func (s *Store) AddOperatorTokenAs(ctx context.Context, name, role, token string) error {
	if !ValidOperatorName(name) {
		return fmt.Errorf("store: operator name %q: use 1-63 lowercase letters, digits and ._-", name)
	}
	if !slices.Contains(Roles, role) {
		return fmt.Errorf("store: operator role %q: use one of %s", role, strings.Join(Roles, ", "))
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var tenant bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tenant_tokens WHERE token_hash = $1)`,
			HashToken(token)).Scan(&tenant); err != nil {
			return fmt.Errorf("store: add operator token: %w", err)
		}
		if tenant {
			return fmt.Errorf("%w: that token is a tenant's", ErrExists)
		}
		_, err := tx.Exec(ctx, `INSERT INTO operator_tokens (name, token_hash, role) VALUES ($1, $2, $3)`, name, HashToken(token), role)
		if SQLState(err) == "23505" {
			return fmt.Errorf("%w: operator %q has an active token, or the token is in use", ErrExists, name)
		}
		if err != nil {
			return fmt.Errorf("store: add operator token: %w", err)
		}
		return nil
	})
}

// OperatorByToken resolves a bearer token to its operator; ErrNotFound for
// an unknown or revoked one.
func (s *Store) OperatorByToken(ctx context.Context, token string) (Operator, error) {
	var o Operator
	err := s.pool.QueryRow(ctx, `SELECT name, role FROM operator_tokens WHERE token_hash = $1 AND revoked_at IS NULL`,
		HashToken(token)).Scan(&o.Name, &o.Role)
	if errors.Is(err, pgx.ErrNoRows) {
		return Operator{}, ErrNotFound
	}
	return o, err
}

// OperatorTokens lists the operator tokens, revoked ones too, oldest first.
func (s *Store) OperatorTokens(ctx context.Context) ([]OperatorToken, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, name, role, created_at, revoked_at FROM operator_tokens ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("store: operator tokens: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (OperatorToken, error) {
		var t OperatorToken
		err := r.Scan(&t.ID, &t.Name, &t.Role, &t.CreatedAt, &t.RevokedAt)
		return t, err
	})
}

// RevokeOperatorToken revokes name's active token; ErrNotFound when it has
// none.
func (s *Store) RevokeOperatorToken(ctx context.Context, name string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE operator_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL`, name)
	if err != nil {
		return fmt.Errorf("store: revoke operator token: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}
