package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// The rest of a partial review (migration 0025): a review in parts that its
// cost cap, its tenant's budget or its deadline stopped is accepted with
// what it reviewed, and an operator asks for the rest with its own cost
// cap. The rest is work of its own — the same tenant, contract, source
// and input, its revision the first one's with "+rest<n>" after it — so it
// has its own result and publication (a check run and the comments of the
// parts it reviews), and the parts published before are not reviewed or
// paid for again.

// restMark separates a continuation's number from the revision it
// continues.
const restMark = "+rest"

// HeadRevision is the revision a continuation reviews: revision without
// its "+rest<n>".
func HeadRevision(revision string) string {
	head, _, _ := strings.Cut(revision, restMark)
	return head
}

// ErrNotPartial is returned by ReviewRest for work that is not an
// accepted partial review, or whose every part has been reviewed.
var ErrNotPartial = errors.New("only an accepted partial review has a rest to review")

// PartsFacts are what a review in parts reads of its work beyond the work
// row: the cost caps over the cell's, and which parts a review it
// continues has already published.
type PartsFacts struct {
	// RestOf is the work whose partial review this work continues; "" for
	// a review of its own.
	RestOf string
	// CostCap is the work's own cap on its calls' estimated cost, 0 for
	// none; TenantCostCap its tenant's.
	CostCap       int64
	TenantCostCap int64
	// Published are the ids of the parts that the reviews it continues
	// published (the first one's and its other continuations' accepted
	// results): they are neither reviewed nor merged again.
	Published []string
}

// coverageParts is what ReviewRest and PartsFacts read of a result's
// coverage.
type coverageParts struct {
	Parts    int      `json:"parts"`
	Reviewed []string `json:"reviewed"`
	Earlier  []string `json:"earlier"`
}

// publishedParts is the union of the parts the coverages name as reviewed
// or reviewed before, and the most parts any of them counts.
func publishedParts(raw []byte) (ids []string, parts int, err error) {
	var covs []coverageParts
	if err := json.Unmarshal(raw, &covs); err != nil {
		return nil, 0, err
	}
	for _, c := range covs {
		parts = max(parts, c.Parts)
		ids = append(append(ids, c.Reviewed...), c.Earlier...)
	}
	slices.Sort(ids)
	return slices.Compact(ids), parts, nil
}

// chainCoverage reads, as a JSON array, the coverage of every accepted
// result of the review rooted at the work root names (the first work and
// its continuations) other than that of the work self names.
func chainCoverage(root, self string) string {
	return `(SELECT coalesce(json_agg(a.coverage), '[]')
	FROM work c JOIN results r ON r.work_id = c.id AND r.schema_version = c.schema_version
		JOIN attempts a ON a.id = r.attempt_id
	WHERE (c.id = ` + root + ` OR c.rest_of = ` + root + `) AND c.id <> ` + self + `
		AND c.state = 'accepted' AND a.coverage IS NOT NULL)`
}

// PartsFacts reads what a review in parts of work id needs beyond its row.
func (s *Store) PartsFacts(ctx context.Context, id string) (PartsFacts, error) {
	var f PartsFacts
	var chain []byte
	err := s.pool.QueryRow(ctx, `SELECT coalesce(w.rest_of, ''), coalesce(w.cost_cap_micros, 0),
			coalesce((SELECT work_cost_cap_micros FROM tenants t WHERE t.id = w.tenant_id), 0),
			CASE WHEN w.rest_of IS NULL THEN '[]' ELSE `+chainCoverage("w.rest_of", "w.id")+` END
		FROM work w WHERE w.id = $1`, id).Scan(&f.RestOf, &f.CostCap, &f.TenantCostCap, &chain)
	if errors.Is(err, pgx.ErrNoRows) {
		return f, ErrNotFound
	}
	if err == nil {
		f.Published, _, err = publishedParts(chain)
	}
	if err != nil {
		return f, fmt.Errorf("store: parts facts of %s: %w", id, err)
	}
	return f, nil
}

// ReviewRest queues the rest of the partial review of work id (or of the
// review a continuation id belongs to) as new work under its own cost cap,
// and writes its announcement, in one transaction. A continuation not yet
// finished is returned as it is (created false): asking twice makes one.
// It refuses work that is not an accepted partial review or whose every
// part has since been reviewed (ErrNotPartial), and a revision that a
// later push of its source replaced (ErrSuperseded). idOf derives the new
// work's id from its ingress key.
func (s *Store) ReviewRest(ctx context.Context, id string, costCap int64, deadline time.Time,
	idOf func(tenant, contract, source, revision string) string,
	announce func(*Work) ([]OutboxMsg, error)) (got *Work, created bool, err error) {
	if costCap <= 0 {
		return nil, false, fmt.Errorf("store: review rest of %s: cost cap %d is not positive", id, costCap)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var root string
		if err := tx.QueryRow(ctx, `SELECT coalesce(rest_of, id) FROM work WHERE id = $1`, id).Scan(&root); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		first, err := scanWork(tx.QueryRow(ctx, `SELECT `+workColumns+` FROM work WHERE id = $1 FOR UPDATE`, root))
		if err != nil {
			return err
		}
		if got, err = scanWork(tx.QueryRow(ctx, `SELECT `+workColumns+` FROM work
			WHERE rest_of = $1 AND state IN ('queued', 'running') LIMIT 1`, root)); err == nil {
			return nil
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
		var chain []byte
		var rests int
		if err := tx.QueryRow(ctx, `SELECT `+chainCoverage("$1", "''")+`, (SELECT count(*) FROM work WHERE rest_of = $1)`,
			root).Scan(&chain, &rests); err != nil {
			return err
		}
		done, parts, err := publishedParts(chain)
		if err != nil {
			return err
		}
		if first.State != outcome.Accepted || parts == 0 {
			return fmt.Errorf("work %s is %s, not a review in parts: %w", root, first.State, ErrNotPartial)
		}
		if len(done) >= parts {
			return fmt.Errorf("work %s: all %d parts have been reviewed: %w", root, parts, ErrNotPartial)
		}
		if newer, err := newerRevision(ctx, tx, root); err != nil {
			return err
		} else if newer != "" {
			return fmt.Errorf("work %s: revision %s of %s came later; its review stands in for this one: %w",
				root, newer, first.SourceID, ErrSuperseded)
		}
		revision := first.Revision + restMark + strconv.Itoa(rests+1)
		got, err = scanWork(tx.QueryRow(ctx, `INSERT INTO work (id, tenant_id, region, contract, schema_version,
				taxonomy_version, source_id, revision, lane, input, content_digest, deadline_at, source_updated_at,
				state, model, prompt_digest, rest_of, cost_cap_micros)
			SELECT $1, tenant_id, region, contract, schema_version, taxonomy_version, source_id, $2, lane, input,
				content_digest, $3, source_updated_at, 'queued', model, prompt_digest, id, $4
			FROM work WHERE id = $5
			RETURNING `+workColumns,
			idOf(first.TenantID, first.Contract, first.SourceID, revision), revision, deadline, costCap, root))
		if err != nil {
			return err
		}
		created = true
		msgs, err := announce(got)
		if err != nil {
			return err
		}
		return insertOutbox(ctx, tx, msgs)
	})
	if err != nil {
		return nil, false, fmt.Errorf("store: review rest of %s: %w", id, err)
	}
	return got, created, nil
}

// SetWorkCostCap sets a tenant's cap on one work item's estimated cost in
// micro-dollars; 0 removes it.
func (s *Store) SetWorkCostCap(ctx context.Context, tenant string, micros int64) error {
	if micros < 0 {
		return fmt.Errorf("store: work cost cap %d is negative", micros)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE tenants SET work_cost_cap_micros = nullif($2, 0) WHERE id = $1`, tenant, micros)
	if err != nil {
		return fmt.Errorf("store: set work cost cap of %s: %w", tenant, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}
