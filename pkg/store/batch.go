package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"assay.dev/pkg/outcome"
)

// Batch is a manifest of work items, each named by an item id that is
// stable and unique in the batch.
type Batch struct {
	ID          string
	TenantID    string
	Contract    string
	ItemCount   int
	ItemsDigest string
	DeadlineAt  time.Time
	CreatedAt   time.Time
	// CanceledAt is when the batch was canceled, zero while it is not.
	CanceledAt time.Time
}

// BatchEntry is one item of a batch being inserted: its id and its work.
type BatchEntry struct {
	ItemID string
	Work   *Work
	// After InsertBatch: the work the ingress fence gave the item (a key
	// already accepted gives the existing work) and whether it is new.
	Got     *Work
	Created bool
}

// ErrBatchConflict is returned when a batch id is taken by a batch with
// other items.
var ErrBatchConflict = errors.New("store: batch id taken by a batch with other items")

const batchColumns = `id, tenant_id, contract, item_count, items_digest, deadline_at, created_at, coalesce(canceled_at, 'epoch')`

func scanBatch(row pgx.Row) (*Batch, error) {
	var b Batch
	err := row.Scan(&b.ID, &b.TenantID, &b.Contract, &b.ItemCount, &b.ItemsDigest, &b.DeadlineAt, &b.CreatedAt, &b.CanceledAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if b.CanceledAt.Equal(time.Unix(0, 0)) {
		b.CanceledAt = time.Time{}
	}
	return &b, err
}

// InsertBatch stores a batch and its items in one transaction: each item's
// work goes through the ingress fence (a key accepted already gives the
// existing work; dropped work is queued again), a new revision supersedes
// the same source's unfinished ones, new work is announced as submitted
// work is, and the manifest names each item. The statements are set-based:
// a batch costs a handful of them, whatever its size. A batch whose id
// exists already is returned with created=false when its items digest
// matches, and refused with ErrBatchConflict when it does not; its
// entries' Got are then unset. Every entry's work is of the batch's tenant
// and contract.
func (s *Store) InsertBatch(ctx context.Context, b *Batch, entries []*BatchEntry, announce func(*Work) ([]OutboxMsg, error)) (got *Batch, created bool, err error) {
	// Rows are written in work id order, so two batches naming the same
	// work cannot deadlock each other.
	order := make([]*BatchEntry, len(entries))
	copy(order, entries)
	sort.Slice(order, func(i, j int) bool { return order[i].Work.ID < order[j].Work.ID })
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		got, err = scanBatch(tx.QueryRow(ctx, `INSERT INTO batches (id, tenant_id, contract, item_count, items_digest, deadline_at)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING RETURNING `+batchColumns,
			b.ID, b.TenantID, b.Contract, len(entries), b.ItemsDigest, b.DeadlineAt))
		if errors.Is(err, ErrNotFound) {
			got, err = scanBatch(tx.QueryRow(ctx, `SELECT `+batchColumns+` FROM batches WHERE id = $1`, b.ID))
			if err != nil {
				return err
			}
			if got.TenantID != b.TenantID || got.ItemsDigest != b.ItemsDigest {
				return ErrBatchConflict
			}
			return nil
		}
		if err != nil {
			return err
		}
		created = true
		return insertBatchWork(ctx, tx, got, order, announce)
	})
	if errors.Is(err, ErrBatchConflict) {
		return nil, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("store: insert batch: %w", err)
	}
	return got, created, nil
}

// insertBatchWork is the ingress fence for a batch's items, in id order:
// the fence's one statement (insertGroup), each item asked for as a batch's
// item and superseding its source's older revisions; the manifest names
// each item's work.
func insertBatchWork(ctx context.Context, tx pgx.Tx, b *Batch, order []*BatchEntry, announce func(*Work) ([]OutboxMsg, error)) error {
	if len(order) == 0 {
		return nil
	}
	if err := sameRoute(b, order); err != nil {
		return err
	}
	reqs := make([]InsertReq, len(order))
	for i, e := range order {
		w := *e.Work
		w.SupersedeOlder = true
		reqs[i] = InsertReq{Work: &w, Announce: announce, Item: true}
	}
	items, workIDs := make([]string, len(order)), make([]string, len(order))
	for i, got := range insertGroup(ctx, tx, reqs) {
		e := order[i]
		if got.Err != nil {
			return fmt.Errorf("item %s: %w", e.ItemID, got.Err)
		}
		e.Got, e.Created = got.Work, got.Created
		items[i], workIDs[i] = e.ItemID, got.Work.ID
	}
	_, err := tx.Exec(ctx, `INSERT INTO batch_items (batch_id, item_id, tenant_id, work_id)
		SELECT $1, item_id, $2, work_id FROM unnest($3::text[], $4::text[]) AS x(item_id, work_id)`,
		b.ID, b.TenantID, items, workIDs)
	return err
}

// sameRoute checks that every item's work is of b's tenant and contract and
// made by the route of the first: one version, model and prompt.
func sameRoute(b *Batch, order []*BatchEntry) error {
	first := order[0].Work
	for _, e := range order {
		w := e.Work
		if w.TenantID != b.TenantID || w.Contract != b.Contract {
			return fmt.Errorf("item %s: work of tenant %s and contract %s in a batch of %s and %s", e.ItemID, w.TenantID, w.Contract, b.TenantID, b.Contract)
		}
		if w.SchemaVersion != first.SchemaVersion || w.Model != first.Model || w.PromptDigest != first.PromptDigest || w.ShadowOf != "" {
			return fmt.Errorf("item %s: made by another route than the batch's first item", e.ItemID)
		}
	}
	return nil
}

// GetBatch reads a tenant's batch; another tenant's is ErrNotFound.
func (s *Store) GetBatch(ctx context.Context, tenant, id string) (*Batch, error) {
	return scanBatch(s.pool.QueryRow(ctx, `SELECT `+batchColumns+` FROM batches WHERE id = $1 AND tenant_id = $2`, id, tenant))
}

// BatchItem is one item of a batch as it stands.
type BatchItem struct {
	ItemID    string
	WorkID    string
	State     string
	Reason    string
	UpdatedAt time.Time
	// Output is the accepted output, nil unless the item was accepted and
	// it was asked for.
	Output json.RawMessage
}

// BatchItemFilter selects items of one batch, in item id order (bytewise).
type BatchItemFilter struct {
	BatchID string
	// After is the last item id of the previous page, "" for the first.
	After string
	// NotAccepted keeps only the items that have not been accepted.
	NotAccepted bool
	// WithOutput reads accepted items' output.
	WithOutput bool
	Limit      int
}

// BatchItems reads items of a batch with their work's state.
func (s *Store) BatchItems(ctx context.Context, f BatchItemFilter) ([]BatchItem, error) {
	rows, err := s.pool.Query(ctx, `SELECT i.item_id, i.work_id, w.state, coalesce(w.reason, ''), w.updated_at,
			CASE WHEN $4 THEN (SELECT r.output FROM results r WHERE r.work_id = w.id AND w.state = 'accepted') END
		FROM batch_items i JOIN work w ON w.id = i.work_id
		WHERE i.batch_id = $1 AND i.item_id COLLATE "C" > $2 AND (NOT $3 OR w.state <> 'accepted')
		ORDER BY i.item_id COLLATE "C" LIMIT $5`, f.BatchID, f.After, f.NotAccepted, f.WithOutput, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("store: batch items %s: %w", f.BatchID, err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BatchItem, error) {
		var it BatchItem
		var out []byte
		err := r.Scan(&it.ItemID, &it.WorkID, &it.State, &it.Reason, &it.UpdatedAt, &out)
		if out != nil {
			it.Output = out
		}
		return it, err
	})
	if err != nil {
		return nil, fmt.Errorf("store: batch items %s: %w", f.BatchID, err)
	}
	return items, nil
}

// BatchOverview is a batch's items counted per work state, and the items
// without a result, all read from one snapshot so that the counts and the
// names agree.
type BatchOverview struct {
	Counts map[string]int
	// Failed are items that ended without being accepted, Pending those
	// with no outcome yet, in item order, each at most named+1 long (one
	// more than asked tells the list was cut).
	Failed, Pending []BatchItem
}

// BatchOverview reads the overview of a batch, naming up to named items
// per list.
func (s *Store) BatchOverview(ctx context.Context, batchID string, named int) (BatchOverview, error) {
	var o BatchOverview
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT coalesce(w.state, 'missing'), count(*)
			FROM batch_items i LEFT JOIN work w ON w.id = i.work_id
			WHERE i.batch_id = $1 GROUP BY 1`, batchID)
		if err != nil {
			return err
		}
		o.Counts = map[string]int{}
		for rows.Next() {
			var state string
			var n int
			if err := rows.Scan(&state, &n); err != nil {
				rows.Close()
				return err
			}
			o.Counts[state] = n
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, l := range []struct {
			to      *[]BatchItem
			pending bool
		}{{&o.Failed, false}, {&o.Pending, true}} {
			rows, err := tx.Query(ctx, `SELECT i.item_id, i.work_id, w.state, coalesce(w.reason, ''), w.updated_at
				FROM batch_items i JOIN work w ON w.id = i.work_id
				WHERE i.batch_id = $1 AND w.state <> 'accepted' AND (w.state IN ('queued', 'running')) = $2
				ORDER BY i.item_id COLLATE "C" LIMIT $3`, batchID, l.pending, named+1)
			if err != nil {
				return err
			}
			*l.to, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (BatchItem, error) {
				var it BatchItem
				err := r.Scan(&it.ItemID, &it.WorkID, &it.State, &it.Reason, &it.UpdatedAt)
				return it, err
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return o, fmt.Errorf("store: batch overview %s: %w", batchID, err)
	}
	return o, nil
}

// BatchSignal is a cheap summary of a batch's progress: it changes
// whenever one of its items changes state.
type BatchSignal struct {
	Ended      int
	LastChange time.Time
	CanceledAt time.Time
}

// BatchSignal reads the batch's progress summary in one statement.
func (s *Store) BatchSignal(ctx context.Context, batchID string) (BatchSignal, error) {
	var sig BatchSignal
	err := s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE w.state NOT IN ('queued', 'running', 'elsewhere')),
			coalesce(max(w.updated_at), 'epoch'), coalesce((SELECT canceled_at FROM batches WHERE id = $1), 'epoch')
		FROM batch_items i JOIN work w ON w.id = i.work_id WHERE i.batch_id = $1`, batchID).
		Scan(&sig.Ended, &sig.LastChange, &sig.CanceledAt)
	if err != nil {
		return sig, fmt.Errorf("store: batch signal %s: %w", batchID, err)
	}
	return sig, nil
}

// CanceledItem is work a batch cancel ended; Running says a worker held
// it, whose model call is to be stopped.
type CanceledItem struct {
	WorkID  string
	Running bool
}

// CancelBatch marks a tenant's batch canceled and ends its items that have
// no outcome yet as canceled, in one transaction; a batch that has ended
// already is left as it is. The cancel's scope is the batch's own work:
// work another live batch of the tenant also names is left to that batch,
// and work the tenant also asked for on its own (POST /v1/work, a
// webhook: the same key, so the same work) is left to that request.
// Running work loses its lease: its answer, should it come, is recorded stale and never
// published. cancel makes the outbox rows that stop the running calls. A
// second cancel finds nothing left to end and returns the batch as it is.
func (s *Store) CancelBatch(ctx context.Context, tenant, id string, cancel func([]CanceledItem) ([]OutboxMsg, error)) (*Batch, []CanceledItem, error) {
	var b *Batch
	var ended []CanceledItem
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		// A batch whose every item has its outcome has nothing to cancel
		// and stays as it ended.
		b, err = scanBatch(tx.QueryRow(ctx, `UPDATE batches SET canceled_at = coalesce(canceled_at,
				CASE WHEN EXISTS (SELECT 1 FROM batch_items i JOIN work w ON w.id = i.work_id
					WHERE i.batch_id = batches.id AND w.state IN ('queued', 'running')) THEN now() END)
			WHERE id = $1 AND tenant_id = $2 RETURNING `+batchColumns, id, tenant))
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `WITH old AS (SELECT w.id, w.state FROM work w
				WHERE w.id IN (SELECT work_id FROM batch_items WHERE batch_id = $1)
					AND w.state IN ('queued', 'running') AND NOT w.direct
					AND NOT EXISTS (SELECT 1 FROM batch_items o JOIN batches ob ON ob.id = o.batch_id
						WHERE o.work_id = w.id AND o.batch_id <> $1 AND ob.canceled_at IS NULL)
				ORDER BY w.id FOR UPDATE OF w)
			UPDATE work w SET state = $2, reason = 'batch ' || $1 || ' was canceled', lease_token = NULL,
				lease_expires_at = NULL, updated_at = now()
			FROM old WHERE w.id = old.id
			RETURNING w.id, old.state = 'running'`, id, outcome.Canceled)
		if err != nil {
			return err
		}
		ended, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (CanceledItem, error) {
			var c CanceledItem
			err := r.Scan(&c.WorkID, &c.Running)
			return c, err
		})
		if err != nil || cancel == nil {
			return err
		}
		msgs, err := cancel(ended)
		if err != nil {
			return err
		}
		return insertOutbox(ctx, tx, msgs)
	})
	if errors.Is(err, ErrNotFound) {
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, fmt.Errorf("store: cancel batch %s: %w", id, err)
	}
	return b, ended, nil
}
