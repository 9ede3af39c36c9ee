package store

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// LedgerCursor is a place in the ledger's export order: the rows after it
// have not been exported yet. The order is the transaction that inserted a
// row, then its attempt id; an export stops below the oldest transaction
// still running, so a row committed later never lands behind a cursor
// already handed out. The zero cursor is the start of the ledger.
type LedgerCursor struct {
	// Xact is the inserting transaction's id (xid8).
	Xact uint64
	// AttemptID is the last row exported of that transaction; empty, the
	// cursor stands before every row of Xact: the export has read every row
	// of an earlier transaction.
	AttemptID string
}

// String is the cursor as assay usage export prints it: "XACT" or
// "XACT.ATTEMPT".
func (c LedgerCursor) String() string {
	s := strconv.FormatUint(c.Xact, 10)
	if c.AttemptID != "" {
		s += "." + c.AttemptID
	}
	return s
}

// ParseLedgerCursor reads a cursor String printed.
func ParseLedgerCursor(s string) (LedgerCursor, error) {
	x, id, dot := strings.Cut(s, ".")
	xact, err := strconv.ParseUint(x, 10, 64)
	if err != nil || (dot && id == "") {
		return LedgerCursor{}, fmt.Errorf("cursor %q: not XACT or XACT.ATTEMPT as an export printed it", s)
	}
	if id != "" && !attemptRE.MatchString(id) {
		return LedgerCursor{}, fmt.Errorf("cursor %q: %q is not an attempt id", s, id)
	}
	return LedgerCursor{Xact: xact, AttemptID: id}, nil
}

// attemptRE is an attempt id as the ledger spells it.
var attemptRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// ExportedRow is one ledger row as it is exported, with its work's
// contract and version.
type ExportedRow struct {
	LedgerRow
	Contract        string
	ContractVersion string
	Shadow          bool
	// Cursor is the place just after the row.
	Cursor LedgerCursor
}

// LedgerExport selects the rows ExportLedger writes.
type LedgerExport struct {
	// After is where the export resumes; zero, from the start.
	After LedgerCursor
	// Tenant, when set, exports that tenant's rows alone.
	Tenant string
	// Since, when set, exports rows that occurred at or after it.
	Since time.Time
	// Limit bounds the rows exported; 0, all there are.
	Limit int
}

// exportPage is how many rows one query of an export reads.
const exportPage = 1000

// ExportLedger hands each ledger row q selects to each, in the export's
// order, and returns the cursor to resume from: the last row's when Limit
// cut the export short, else the place before the oldest transaction still
// running, past every row the export could read (filtered out or not).
// Rows an unfinished transaction may still precede are left for the next
// export.
func (s *Store) ExportLedger(ctx context.Context, q LedgerExport, each func(ExportedRow) error) (LedgerCursor, error) {
	if q.After.AttemptID != "" && !attemptRE.MatchString(q.After.AttemptID) {
		return q.After, fmt.Errorf("store: export: cursor attempt %q is not an attempt id", q.After.AttemptID)
	}
	var horizon uint64
	if err := s.pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())`).Scan(&horizon); err != nil {
		return q.After, fmt.Errorf("store: export: %w", err)
	}
	at, n := q.After, 0
	for {
		page := exportPage
		if q.Limit > 0 {
			page = min(page, q.Limit-n)
		}
		rows, err := s.exportPage(ctx, q, at, horizon, page)
		if err != nil {
			return at, err
		}
		for _, r := range rows {
			if err := each(r); err != nil {
				return at, err
			}
			at, n = r.Cursor, n+1
		}
		switch {
		case q.Limit > 0 && n == q.Limit:
			return at, nil
		case len(rows) < page:
			if horizon > at.Xact {
				at = LedgerCursor{Xact: horizon}
			}
			return at, nil
		}
	}
}

// exportSQL reads one page of the export: rows past a cursor ($1, $2) and
// below the horizon ($3), of a tenant ($4, or any) that occurred since $5.
// %s is > past a row, >= before a transaction's first row.
const exportSQL = `SELECT l.xact, l.attempt_id::text, l.tenant_id, l.work_id, w.contract, w.schema_version, l.model,
		coalesce(l.served_model, ''), l.outcome, l.upstream_attempts, l.input_units, l.cached_input_units, l.output_units,
		l.reasoning_units, l.cost_micros, l.latency_ms, l.occurred_at, l.estimated, l.shadow
	FROM ledger l JOIN work w ON w.id = l.work_id AND w.tenant_id = l.tenant_id
	WHERE (l.xact, l.attempt_id) %s ($1::text::xid8, $2::uuid) AND l.xact < $3::text::xid8
		AND ($4 = '' OR l.tenant_id = $4) AND l.occurred_at >= $5
	ORDER BY l.xact, l.attempt_id LIMIT $6`

// nilAttempt sorts before every attempt id: a cursor before a
// transaction's rows compares with it.
const nilAttempt = "00000000-0000-0000-0000-000000000000"

func (s *Store) exportPage(ctx context.Context, q LedgerExport, at LedgerCursor, horizon uint64, limit int) ([]ExportedRow, error) {
	sql, id := fmt.Sprintf(exportSQL, ">"), at.AttemptID
	if id == "" {
		sql, id = fmt.Sprintf(exportSQL, ">="), nilAttempt
	}
	rows, err := s.pool.Query(ctx, sql, strconv.FormatUint(at.Xact, 10), id, strconv.FormatUint(horizon, 10),
		q.Tenant, q.Since, limit)
	if err != nil {
		return nil, fmt.Errorf("store: export: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ExportedRow, error) {
		var e ExportedRow
		err := r.Scan(&e.Cursor.Xact, &e.AttemptID, &e.TenantID, &e.WorkID, &e.Contract, &e.ContractVersion, &e.Model,
			&e.ServedModel, &e.Outcome, &e.UpstreamAttempts, &e.InputUnits, &e.CachedInputUnits, &e.OutputUnits,
			&e.ReasoningUnits, &e.CostMicros, &e.LatencyMS, &e.OccurredAt, &e.Estimated, &e.Shadow)
		e.Cursor.AttemptID = e.AttemptID
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: export: %w", err)
	}
	return out, nil
}
