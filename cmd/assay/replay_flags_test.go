package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// A bad selection or flag exits 2 and names what is wrong, before any
// connection is made.
func TestReplayFlagErrors(t *testing.T) {
	t.Setenv("ASSAY_REGION", "us")
	t.Setenv("ASSAY_DATABASE_URL", "postgres://127.0.0.1:1/none")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay"}, "usage: assay replay"},
		{[]string{"replay", "rewind"}, "usage: assay replay"},
		{[]string{"replay", "dump", "--since", "yesterday"}, `--since: "yesterday" is neither a time`},
		{[]string{"replay", "dump", "--since", "1h", "--until", "2h"}, "is not before --until"},
		{[]string{"replay", "dump", "--stream", "outcomes"}, `--stream: "outcomes" is not one of WORK, RESULT, ATTEMPT`},
		{[]string{"replay", "dump", "--seq", "9-3", "--stream", "work"}, `--seq: "9-3" is not a sequence range`},
		{[]string{"replay", "dump", "--seq", "3"}, "--seq needs one --stream"},
		{[]string{"replay", "dump", "--lane", "batch", "--stream", "result"}, "--lane selects WORK messages only"},
		{[]string{"replay", "dump", "--lane", "bulk"}, `--lane: "bulk" is not a lane`},
		{[]string{"replay", "dump", "--tenant", "Acme"}, `--tenant: "Acme" is not a tenant id`},
		{[]string{"replay", "dump", "--confirm", "3"}, "--confirm and --again are for redrive"},
		{[]string{"replay", "redrive", "--confirm", "-3"}, "--confirm: -3 is not a count"},
		{[]string{"replay", "dump", "--work", "w_08"}, `--work: "w_08" is not a work id`},
		{[]string{"replay", "redrive", "--work", "W_0123456789ABCDEF01234567"}, `is not a work id`},
		{[]string{"replay", "redrive", "--deadline", "-1m"}, "--deadline: -1m0s is not a positive duration"},
		{[]string{"replay", "revalidate", "--contracts", "/nonexistent"}, "--contracts: /nonexistent is not a directory"},
		{[]string{"replay", "dump", "--region", "mars"}, "mars"},
		{[]string{"streams", "extra"}, `unexpected argument "extra"`},
		{[]string{"work", "show"}, "work show takes one work id, got 0"},
		{[]string{"work", "list", "--state", "finished"}, `--state: "finished" is not one of queued, running, elsewhere, accepted`},
		{[]string{"work", "list", "--limit", "0"}, "--limit: 0 is not from 1 to 1000"},
		{[]string{"work", "list", "--after", "nonsense"}, `--after: "nonsense" is not a cursor`},
	} {
		var stderr bytes.Buffer
		if code := run(c.args, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("assay %s: exit %d, %q; want exit 2 naming %q", strings.Join(c.args, " "), code, stderr.String(), c.want)
		}
	}
}

func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"90m":                  now.Add(-90 * time.Minute),
		"2026-11-30":           time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
		"2026-11-30T08:15:00Z": time.Date(2026, 11, 30, 8, 15, 0, 0, time.UTC),
	} {
		got, err := parseWhen(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseWhen("-5m", now); err == nil {
		t.Error("a negative duration is not a time back from now")
	}
}
