package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"assay.dev/pkg/model"
)

// batchOf uploads one moderation request per text, custom_id "line-i",
// and creates a batch on them.
func batchOf(t *testing.T, c *model.Client, texts ...string) model.BatchObject {
	t.Helper()
	ctx := context.Background()
	var lines []model.BatchRequestLine
	for i, text := range texts {
		in, _ := json.Marshal(map[string]string{"text": text})
		body, err := c.RequestBody(model.Call{Tenant: "acme", Contract: ContractModeration, Schema: json.RawMessage(`{}`),
			Messages: model.Messages("Moderate.", model.Correlation{WorkID: fmt.Sprintf("w%d", i)}, "", in)})
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, model.BatchRequestLine{CustomID: fmt.Sprintf("line-%d", i), Method: "POST", URL: model.BatchChatEndpoint, Body: body})
	}
	file, err := model.BatchInput(lines)
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.UploadBatchFile(ctx, "in.jsonl", file)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateBatch(ctx, f.ID, "24h", map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != model.BatchValidating || b.RequestCounts.Total != len(texts) {
		t.Fatalf("created batch: %+v", b)
	}
	return b
}

// finish polls a batch until it ends, returning the statuses it showed
// and its output and error lines.
func finish(t *testing.T, c *model.Client, id string) (statuses []string, b model.BatchObject, out, errs []model.BatchOutputLine) {
	t.Helper()
	ctx := context.Background()
	for range 10 {
		var err error
		if b, err = c.GetBatch(ctx, id); err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, b.Status)
		if model.BatchEnded(b.Status) {
			break
		}
	}
	read := func(fileID string) []model.BatchOutputLine {
		if fileID == "" {
			return nil
		}
		raw, err := c.FileContent(ctx, fileID)
		if err != nil {
			t.Fatal(err)
		}
		lines, bad := model.ParseBatchOutput(raw)
		if bad != 0 {
			t.Fatalf("%d unreadable lines in %s", bad, fileID)
		}
		return lines
	}
	return statuses, b, read(b.OutputFileID), read(b.ErrorFileID)
}

func ids(lines []model.BatchOutputLine) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l.CustomID)
	}
	return out
}

func TestBatchAPI(t *testing.T) {
	t.Parallel()
	type want struct {
		statuses  []string
		out, errs []string
		lines     int // run, each a call
	}
	for _, tc := range []struct {
		name   string
		faults []BatchFault
		chat   []Fault
		want   want
	}{
		{"happy", nil, nil, want{[]string{"in_progress", "finalizing", "completed"}, []string{"line-0", "line-1", "line-2"}, nil, 3}},
		{"out of order", []BatchFault{{Kind: BatchOutOfOrder}}, nil,
			want{[]string{"in_progress", "finalizing", "completed"}, []string{"line-2", "line-1", "line-0"}, nil, 3}},
		{"missing line", []BatchFault{{Kind: BatchMissingLine, Match: "beta"}}, nil,
			want{[]string{"in_progress", "finalizing", "completed"}, []string{"line-0", "line-2"}, nil, 3}},
		{"failed line", nil, []Fault{{Kind: FaultServerError, Match: "gamma"}},
			want{[]string{"in_progress", "finalizing", "completed"}, []string{"line-0", "line-1"}, []string{"line-2"}, 3}},
		{"expired", []BatchFault{{Kind: BatchExpire, Match: "alpha"}}, nil,
			want{[]string{"in_progress", "finalizing", "expired"}, []string{"line-1", "line-2"}, []string{"line-0"}, 2}},
		{"failed batch", []BatchFault{{Kind: BatchFail}}, nil, want{[]string{"failed"}, nil, nil, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, base := start(t)
			for _, f := range tc.faults {
				if err := s.AddBatchFault(f); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range tc.chat {
				if err := s.AddFault(f); err != nil {
					t.Fatal(err)
				}
			}
			c := &model.Client{BaseURL: APIBase(base), Model: "m"}
			b := batchOf(t, c, "alpha", "beta", "gamma")
			statuses, end, out, errs := finish(t, c, b.ID)
			if !slices.Equal(statuses, tc.want.statuses) {
				t.Errorf("statuses %v, want %v", statuses, tc.want.statuses)
			}
			if !slices.Equal(ids(out), tc.want.out) || !slices.Equal(ids(errs), tc.want.errs) {
				t.Errorf("output %v and errors %v, want %v and %v", ids(out), ids(errs), tc.want.out, tc.want.errs)
			}
			if got := s.BatchStats().Lines; got != tc.want.lines {
				t.Errorf("%d lines run, want %d", got, tc.want.lines)
			}
			if got := s.Stats().Tenants["acme"].Calls; got != int64(tc.want.lines) {
				t.Errorf("%d calls counted, want %d", got, tc.want.lines)
			}
			for _, l := range out {
				if l.Response == nil || l.Response.StatusCode != 200 {
					t.Errorf("output line %s: %+v", l.CustomID, l.Response)
				}
			}
			if tc.name == "expired" && (errs[0].Error == nil || errs[0].Error.Code != model.ErrorCodeBatchExpired) {
				t.Errorf("expired line: %+v", errs[0])
			}
			if tc.name == "failed batch" && (end.Errors == nil || len(end.Errors.Data) == 0) {
				t.Errorf("failed batch names no error: %+v", end)
			}
		})
	}
}

func TestBatchLostCreateIsFoundByMetadata(t *testing.T) {
	t.Parallel()
	s, base := start(t)
	if err := s.AddBatchFault(BatchFault{Kind: BatchLostCreate, Times: 1}); err != nil {
		t.Fatal(err)
	}
	c := &model.Client{BaseURL: APIBase(base), Model: "m"}
	ctx := context.Background()
	f, err := c.UploadBatchFile(ctx, "in.jsonl", []byte(`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateBatch(ctx, f.ID, "24h", map[string]string{"assay_batch": "b1"})
	var mErr *model.Error
	if !errors.As(err, &mErr) || mErr.Kind != model.KindTransient {
		t.Fatalf("lost create answered %v", err)
	}
	page, err := c.ListBatches(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].Metadata["assay_batch"] != "b1" {
		t.Fatalf("list: %+v", page)
	}
	if _, err := c.CreateBatch(ctx, "file-none", "24h", nil); err == nil {
		t.Fatal("a batch on no file was created")
	}
}
