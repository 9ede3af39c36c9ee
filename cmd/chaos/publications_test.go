package main

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/store"
)

func TestToGitHub(t *testing.T) {
	for _, c := range []struct {
		contract, source string
		want             bool
	}{
		{"code-review", "chaos/code-review#12", true},
		{"code-review", "chaos/code-review#0", false},
		{"code-review", "no-pull-request", false},
		{"code-review", "/repo#3", false},
		{"change-review", "chaos/change-review#12", false},
		{"moderation", "chaos/moderation#12", false},
	} {
		if got := toGitHub(&workRow{Contract: c.contract, SourceID: c.source}); got != c.want {
			t.Errorf("toGitHub(%s, %s) = %v, want %v", c.contract, c.source, got, c.want)
		}
	}
}

func TestExpect(t *testing.T) {
	two := []resultFinding{{File: "a.go", Line: 3}, {File: "b.go", Line: 9}}
	for _, c := range []struct {
		name, state string
		findings    []resultFinding
		partial     bool
		run         bool
		keys        string
	}{
		{"accepted with findings", "accepted", two, false, true, "[0 1]"},
		{"accepted with none", "accepted", nil, false, true, "none"},
		{"a finding at no line is not a comment", "accepted", []resultFinding{{File: "a.go"}, {File: "b.go", Line: 2}}, false, true, "[0]"},
		{"partial review", "accepted", two, true, true, "[0 1 rerun]"},
		{"dropped", "dropped", nil, false, false, "[rerun]"},
		{"expired", "expired", nil, false, true, "none"},
		{"retry exhausted", "retry_exhausted", nil, false, true, "none"},
	} {
		e := expect(c.state, c.findings, c.partial)
		if e.CheckRun != c.run || keys(e.Keys) != c.keys {
			t.Errorf("%s: check run %v, keys %s; want %v, %s", c.name, e.CheckRun, keys(e.Keys), c.run, c.keys)
		}
	}
}

// TestJudgePublications is a row per way a publication can fail to arrive,
// or arrive twice, and the one way it is right.
func TestJudgePublications(t *testing.T) {
	accepted := expect("accepted", []resultFinding{{File: "a.go", Line: 3}, {File: "b.go", Line: 9}}, false)
	dropped := expect("dropped", nil, false)
	published := pubRow{State: "published", PlanComments: 2}
	next := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	held := func(runs int, comments map[string]int) ghHeld {
		h := ghHeld{Runs: map[string]int{}, Comments: map[string]map[string]int{}}
		if runs > 0 {
			h.Runs["w1"] = runs
		}
		if comments != nil {
			h.Comments["w1"] = comments
		}
		return h
	}
	for _, c := range []struct {
		name string
		exp  expectation
		pub  *pubRow
		gh   ghHeld
		want string // a phrase of the first offender; "" for none
	}{
		{"arrived", accepted, &published, held(1, map[string]int{"0": 1, "1": 1}), ""},
		{"dropped arrived", dropped, &published, held(0, map[string]int{"rerun": 1}), ""},
		{"no publication", accepted, nil, held(0, nil), "no GitHub publication recorded"},
		{"pending", accepted, &pubRow{State: "pending", Tries: 3, NextTry: &next, LastError: "HTTP 502"}, held(1, nil),
			"still pending after 3 tries (next try 2026-12-05T10:00:00Z), last error: HTTP 502"},
		{"failed", accepted, &pubRow{State: "failed", Tries: 7, LastError: "github: POST /repos/chaos/code-review/check-runs: HTTP 422",
			Reason: "refused for good"}, held(0, nil), "failed after 7 tries (refused for good), last error: github: POST"},
		{"check run missing", accepted, &published, held(0, map[string]int{"0": 1, "1": 1}), "published, and no check run arrived"},
		{"comment missing", accepted, &published, held(1, map[string]int{"0": 1}), "comment 1 of [0 1] never arrived"},
		{"check run twice", accepted, &published, held(2, map[string]int{"0": 1, "1": 1}), "2 check runs"},
		{"comment twice", accepted, &published, held(1, map[string]int{"0": 2, "1": 1}), "comment 0 posted 2 times"},
		{"comment not asked for", accepted, &published, held(1, map[string]int{"0": 1, "1": 1, "2": 1}), "comment 2 arrived (1×), where its outcome publishes [0 1]"},
		{"dropped work's check run", dropped, &published, held(1, map[string]int{"rerun": 1}), "a check run, where its outcome gets none"},
		{"unreadable result", expectation{State: "accepted", CheckRun: true, Unknown: "accepted with no result"}, &published,
			held(1, nil), "cannot be checked: accepted with no result"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pubs := map[string]pubRow{}
			if c.pub != nil {
				pubs["w1"] = *c.pub
			}
			got := judgePublications(map[string]expectation{"w1": c.exp}, pubs, c.gh)
			switch {
			case c.want == "" && len(got.Offenders) > 0:
				t.Fatalf("offenders %q, want none", got.Offenders)
			case c.want != "" && (len(got.Offenders) == 0 || !strings.Contains(got.Offenders[0], c.want)):
				t.Fatalf("offenders %q, want the first to say %q", got.Offenders, c.want)
			}
		})
	}
}

// TestJudgePublicationsStrangers: a check run or comment of work that is no
// ended pull request review, and a comment with no marker, are violations.
func TestJudgePublicationsStrangers(t *testing.T) {
	gh := ghHeld{Runs: map[string]int{"w9": 1}, Comments: map[string]map[string]int{"w8": {"0": 1}}, Unmarked: []int64{1001}}
	got := judgePublications(map[string]expectation{}, map[string]pubRow{}, gh)
	if got.Unexpected != 3 || len(got.Offenders) != 3 {
		t.Fatalf("unexpected %d, offenders %q; want 3 of each", got.Unexpected, got.Offenders)
	}
}

// TestAwaitPublications: the wait for the publishers is sized from what is
// outstanding and the rate given, and ends when the last pending
// publication is made, not at its deadline.
func TestAwaitPublications(t *testing.T) {
	ctx := context.Background()
	seen := make(chan struct{})
	var once sync.Once
	h := newHarness(Options{}, onLine(func(line string) {
		if strings.Contains(line, "publishing: 1 of 3") {
			once.Do(func() { close(seen) })
		}
	}))
	base := testenv.PostgresURL(t)
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.WithoutCancel(ctx)) })
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, region := range config.DefaultRegions {
		name := "assay_chaos_await_" + region + "_" + stamp
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = admin.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		})
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/" + name
		st, err := store.Open(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.Migrate(ctx)
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		h.pool[region] = pool
	}
	us := h.pool[config.DefaultRegions[0]]
	if _, err := us.Exec(ctx, `INSERT INTO publications (work_id, target, tenant_id, outcome, state, next_try_at, deadline_at)
		VALUES ('w1', 'github', 'tenant1', 'accepted', 'pending', now(), now() + interval '1 day'),
			('w2', 'github', 'tenant1', 'accepted', 'published', NULL, now() + interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	// Three ended reviews in the first cell: w1 pending, w2 published and
	// w3 with no row (the publisher has not seen its outcome). Once the wait
	// has seen them outstanding, the publisher makes w1 and w3.
	go func() {
		<-seen
		_, _ = us.Exec(ctx, `UPDATE publications SET state = 'published', published_at = now() WHERE work_id = 'w1'`)
		_, _ = us.Exec(ctx, `INSERT INTO publications (work_id, target, tenant_id, outcome, state, published_at)
			VALUES ('w3', 'github', 'tenant1', 'expired', 'published', now())`)
	}()
	w := h.awaitPublications(ctx, map[string]int{config.DefaultRegions[0]: 3}, 2)
	if w.Outstanding != 2 || w.Left != 0 {
		t.Fatalf("outstanding %d at the start and %d at the end, want 2 and 0", w.Outstanding, w.Left)
	}
	if want := pubGrace + 2*time.Second; w.Rate != 2 || w.Budget != want {
		t.Fatalf("rate %.1f/s, budget %s; want 2/s and %s (the grace and twice 2 at 2/s)", w.Rate, w.Budget, want)
	}
	if w.Waited > 10*time.Second {
		t.Fatalf("waited %s, want the few seconds until the last was made, far from its deadline", w.Waited)
	}
}

// onLine is an io.Writer that hands each write (the harness logs a line a
// write) to f.
type onLine func(line string)

func (f onLine) Write(p []byte) (int, error) {
	f(string(p))
	return len(p), nil
}
