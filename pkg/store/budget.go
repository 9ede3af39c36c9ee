package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The budget policy lives here, whole: a reservation before each model
// call, its settlement (or correction) from the ledger, and the period rule,
// which is the SQL function budget_period_start (migration 0005) so that
// every statement that names a period asks the same rule.

// PeriodStart asks the database's period rule for the start (UTC) of the
// budget period of kind period ("day" or "month") that holds at.
func (s *Store) PeriodStart(ctx context.Context, period string, at time.Time) (time.Time, error) {
	var start time.Time
	err := s.pool.QueryRow(ctx, `SELECT budget_period_start($1, $2)`, period, at).Scan(&start)
	return start.UTC(), err
}

// Reservation is what Reserve decided.
type Reservation int

// Reservation outcomes.
const (
	// Reserved: the amount is set aside for the attempt (or the tenant has
	// no budget).
	Reserved Reservation = iota
	// Busy: the amount fits only once reservations in flight settle, and
	// they settle at their real cost, which may be less.
	Busy
	// Exhausted: what is already spent leaves no room for the amount.
	Exhausted
)

// Reserve takes amount from the tenant's budget for the current period on
// behalf of one attempt, before its model call. The UPDATE that takes it is
// the fence: it admits the reservation only while reserved + spent + amount
// stays within the limit, so two workers can never both take the last of it.
func (s *Store) Reserve(ctx context.Context, tenantID, attemptID string, amount int64) (res Reservation, err error) {
	// A tenant without a budget costs one read, outside a transaction.
	var limited bool
	if err := s.pool.QueryRow(ctx, `SELECT budget_micros IS NOT NULL FROM tenants WHERE id = $1`, tenantID).
		Scan(&limited); err != nil {
		return Reserved, fmt.Errorf("store: reserve: %w", err)
	}
	if !limited {
		return Reserved, nil
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var limit *int64
		var start time.Time
		if err := tx.QueryRow(ctx, `SELECT budget_micros, budget_period_start(budget_period, now()) FROM tenants WHERE id = $1`,
			tenantID).Scan(&limit, &start); err != nil {
			return err
		}
		if limit == nil {
			res = Reserved
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO budget_periods (tenant_id, period_start, limit_micros)
			VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, tenantID, start, *limit); err != nil {
			return err
		}
		var spent, limitNow int64
		err := tx.QueryRow(ctx, `UPDATE budget_periods SET reserved_micros = reserved_micros + $3
			WHERE tenant_id = $1 AND period_start = $2 AND reserved_micros + spent_micros + $3 <= limit_micros
			RETURNING spent_micros, limit_micros`, tenantID, start, amount).Scan(&spent, &limitNow)
		if errors.Is(err, pgx.ErrNoRows) {
			// Refused; tell a full budget from one that is only busy.
			if err := tx.QueryRow(ctx, `SELECT spent_micros, limit_micros FROM budget_periods
				WHERE tenant_id = $1 AND period_start = $2`, tenantID, start).Scan(&spent, &limitNow); err != nil {
				return err
			}
			res = Busy
			if spent+amount > limitNow {
				res = Exhausted
			}
			return nil
		}
		if err != nil {
			return err
		}
		res = Reserved
		_, err = tx.Exec(ctx, `INSERT INTO budget_reservations (attempt_id, tenant_id, period_start, amount_micros)
			VALUES ($1, $2, $3, $4)`, attemptID, tenantID, start, amount)
		return err
	})
	if err != nil {
		return Exhausted, fmt.Errorf("store: reserve for %s: %w", tenantID, err)
	}
	return res, nil
}

// Release returns a reservation whose attempt never called the model.
func (s *Store) Release(ctx context.Context, attemptID string) error {
	_, err := s.pool.Exec(ctx, `WITH r AS (
			DELETE FROM budget_reservations WHERE attempt_id = $1 AND settled_at IS NULL
			RETURNING tenant_id, period_start, amount_micros)
		UPDATE budget_periods p SET reserved_micros = p.reserved_micros - r.amount_micros
		FROM r WHERE p.tenant_id = r.tenant_id AND p.period_start = r.period_start`, attemptID)
	if err != nil {
		return fmt.Errorf("store: release %s: %w", attemptID, err)
	}
	return nil
}

// An attempt's reservation is settled by RecordLedger, in the statement
// that records its row: the reservation is replaced by the real cost, all
// of which is spent (an excess can only leave less room, and once spent
// passes the limit the tenant's next reservation is refused). An attempt
// without a reservation (its tenant had no budget when it started) is still
// charged to the tenant's current period, when that period exists: setting
// a budget makes the period that holds then, with what the ledger says was
// spent in it (SetBudgetCounted), and each later period begins at its
// first reservation.

// respend corrects what an attempt spent by delta, in the period its
// reservation was taken from, else the tenant's current period.
func respend(ctx context.Context, tx pgx.Tx, tenantID, attemptID string, delta int64) error {
	if delta == 0 {
		return nil
	}
	tag, err := tx.Exec(ctx, `UPDATE budget_periods p SET spent_micros = greatest(p.spent_micros + $3, 0)
		FROM budget_reservations r
		WHERE r.attempt_id = $2 AND p.tenant_id = $1 AND p.period_start = r.period_start`, tenantID, attemptID, delta)
	if err != nil || tag.RowsAffected() > 0 {
		return err
	}
	return spendNow(ctx, tx, tenantID, delta)
}

// spendNow adds delta to what the tenant spent in its current period, when
// it has a budget and that period has begun.
func spendNow(ctx context.Context, tx pgx.Tx, tenantID string, delta int64) error {
	_, err := tx.Exec(ctx, `UPDATE budget_periods p SET spent_micros = greatest(p.spent_micros + $2, 0)
		FROM tenants t WHERE t.id = $1 AND t.budget_micros IS NOT NULL AND p.tenant_id = t.id
			AND p.period_start = budget_period_start(t.budget_period, now())`, tenantID, delta)
	return err
}

// Budget is a tenant's standing for one period.
type Budget struct {
	TenantID       string    `json:"tenantId"`
	PeriodStart    time.Time `json:"periodStart"`
	LimitMicros    int64     `json:"limitMicros"`
	ReservedMicros int64     `json:"reservedMicros"`
	SpentMicros    int64     `json:"spentMicros"`
}

// CurrentBudget reads the tenant's current period; ErrNotFound when the
// tenant has no budget or nothing was reserved this period yet.
func (s *Store) CurrentBudget(ctx context.Context, tenantID string) (Budget, error) {
	var b Budget
	err := s.pool.QueryRow(ctx, `SELECT p.tenant_id, p.period_start, p.limit_micros, p.reserved_micros, p.spent_micros
		FROM budget_periods p WHERE p.tenant_id = $1 ORDER BY p.period_start DESC LIMIT 1`, tenantID).
		Scan(&b.TenantID, &b.PeriodStart, &b.LimitMicros, &b.ReservedMicros, &b.SpentMicros)
	if errors.Is(err, pgx.ErrNoRows) {
		return Budget{}, ErrNotFound
	}
	return b, err
}

// periodSpent is what tenant $1 spent in the period p.start of kind $2, by
// the ledger: each row counts in the period its budget reservation was
// taken in or, without one, in the period that held when the ledger
// recorded it — the period the ledger settled it into.
const periodSpent = `(SELECT greatest(coalesce(sum(l.cost_micros), 0), 0) FROM ledger l
		LEFT JOIN budget_reservations r ON r.attempt_id = l.attempt_id
		WHERE l.tenant_id = $1 AND budget_period_start($2, coalesce(r.created_at, l.recorded_at)) = p.start)`

// setPeriodSQL makes the tenant's current period hold the limit and what
// the ledger says the tenant spent in it so far; what is reserved for
// calls in flight stays.
const setPeriodSQL = `WITH p AS (SELECT budget_period_start($2::text, clock_timestamp()) AS start)
	INSERT INTO budget_periods AS b (tenant_id, period_start, limit_micros, spent_micros)
	SELECT $1, p.start, $3, ` + periodSpent + ` FROM p
	ON CONFLICT (tenant_id, period_start) DO UPDATE SET limit_micros = excluded.limit_micros, spent_micros = excluded.spent_micros
	RETURNING b.period_start, b.limit_micros, b.reserved_micros, b.spent_micros`

// ErrLedgerBusy is returned by SetBudgetCounted when the ledger was
// written at length (a tenant moving in, say) for longer than it waits.
var ErrLedgerBusy = errors.New("the ledger is busy; try again in a moment")

// SetBudgetCounted sets a tenant's budget per period (nil: unlimited) and
// returns its standing in the period that holds now. A budget set or
// changed mid-period counts what the tenant spent in that period before:
// the spend is read from the ledger (periodSpent) while the cell's ledger
// writes wait, so an attempt of the period is counted either here or when
// the ledger settles it afterwards, never both and never neither. Without
// a budget, the period is left as it is and Budget has no limit, only what
// the ledger says was spent.
func (s *Store) SetBudgetCounted(ctx context.Context, tenantID string, micros *int64, period string) (Budget, error) {
	b := Budget{TenantID: tenantID}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if micros != nil {
			// SHARE conflicts with the ROW EXCLUSIVE every ledger write
			// takes: those under way end first, the next wait for the commit.
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `LOCK TABLE ledger IN SHARE MODE`); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(ctx, `UPDATE tenants SET budget_micros = $2, budget_period = $3 WHERE id = $1`,
			tenantID, micros, period)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotFound
		}
		if micros == nil {
			return tx.QueryRow(ctx, `WITH p AS (SELECT budget_period_start($2::text, clock_timestamp()) AS start)
				SELECT p.start, `+periodSpent+` FROM p`, tenantID, period).Scan(&b.PeriodStart, &b.SpentMicros)
		}
		return tx.QueryRow(ctx, setPeriodSQL, tenantID, period, *micros).
			Scan(&b.PeriodStart, &b.LimitMicros, &b.ReservedMicros, &b.SpentMicros)
	})
	switch {
	case errors.Is(err, ErrNotFound):
		return Budget{}, err
	case SQLState(err) == "55P03":
		return Budget{}, fmt.Errorf("store: set budget of %s: %w", tenantID, ErrLedgerBusy)
	case err != nil:
		return Budget{}, fmt.Errorf("store: set budget of %s: %w", tenantID, err)
	}
	b.PeriodStart = b.PeriodStart.UTC()
	return b, nil
}
