package classifier

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"assay.dev/pkg/contract"
	"assay.dev/pkg/devkit/storetest"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/gate"
	"assay.dev/pkg/model"
	"assay.dev/pkg/outcome"
	"assay.dev/pkg/store"
)

// FuzzAnswerBytes sends arbitrary bytes as the model's response body
// through the adapter, the gate and the store's attempt record on real
// Postgres: whatever the bytes, the attempt is recorded on the first try
// and the raw answer comes back exactly as it was sent.
func FuzzAnswerBytes(f *testing.F) {
	for _, seed := range []string{
		`{"choices":[{"message":{"content":"{\"category\":\"spam\",\"confidence\":1,\"needsHumanReview\":false}"}}]}`,
		"\xff\xfe not json \x00",
		`{"choices":[{"message":{"content":"{\"a\":\"\u0000\"}"}}]}`,
		`{"choices":[{"message":{"content":"\xc0\xaf"}}]}`,
		"", "\x00", `{"choices":[]}`, `{"error":{"message":"boom"}}`,
	} {
		f.Add([]byte(seed))
	}
	ctx := context.Background()
	st, url := storetest.Migrated(f, store.TenantSeed{ID: "acme", HomeRegion: "us", Token: "tok"})
	db := testenv.Pool(f, url)
	if _, _, err := st.InsertWork(ctx, &store.Work{ID: "w_fuzz", TenantID: "acme", Region: "us", Contract: "moderation",
		SchemaVersion: "moderation/1", TaxonomyVersion: "2026-11", SourceID: "fuzz", Revision: "r1", Lane: "batch",
		Input: `{"text":"x"}`, Digest: "sha256:00", DeadlineAt: time.Now().Add(time.Hour)},
		func(*store.Work) ([]store.OutboxMsg, error) { return nil, nil }); err != nil {
		f.Fatal(err)
	}
	reg, err := contract.Load()
	if err != nil {
		f.Fatal(err)
	}
	c, _ := reg.Get("moderation")
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body.Load().([]byte))
	}))
	f.Cleanup(srv.Close)
	client := &model.Client{BaseURL: srv.URL + "/v1", Model: "m"}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, raw []byte) {
		body.Store(raw)
		reply, callErr := client.Complete(ctx, model.Call{Tenant: "acme", Contract: "moderation", Schema: c.Schema,
			Messages: []model.Message{{Role: "user", Content: "x"}}})
		out, has := output(reply, callErr)
		reason := ""
		if has {
			if _, fail := gate.Check(c, []byte(out), gate.Expect{WorkID: "w_fuzz"}); fail != nil {
				reason = fail.Error()
			}
		} else {
			reason = publicText(callErr)
		}
		num := n.Add(1)
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", num)
		if _, err := db.Exec(ctx, `INSERT INTO attempts (id, work_id, tenant_id, number, lease_token)
			VALUES ($1, 'w_fuzz', 'acme', $2, gen_random_uuid())`, id, num); err != nil {
			t.Fatal(err)
		}
		if _, err := st.RecordAttempt(ctx, store.AttemptRecord{AttemptID: id, WorkID: "w_fuzz",
			Outcome: outcome.AttemptInvalidOutput, Reason: reason, Raw: []byte(out)}); err != nil {
			t.Fatalf("the attempt with answer %q was not recorded: %v", out, err)
		}
		var kept []byte
		if err := db.QueryRow(ctx, `SELECT raw_response FROM attempts WHERE id = $1`, id).Scan(&kept); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(kept, []byte(out)) {
			t.Fatalf("kept %q, sent %q", kept, out)
		}
	})
}
