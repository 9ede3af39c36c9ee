package main

import (
	"bytes"
	"strings"
	"testing"
)

// A mistyped command, subcommand or argument exits 2 and says what was
// wrong, --help or not; help is printed only for what exists.
func TestCommandMistakesAreNamed(t *testing.T) {
	for _, k := range []string{"ASSAY_REGION", "ASSAY_DATABASE_URL", "ASSAY_REGIONS"} {
		t.Setenv(k, "")
	}
	const db = "postgres://postgres@127.0.0.1:1/none"
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"tenants", "list"}, 2, `unknown tenants command "list" (it takes seed)`},
		{[]string{"tenants"}, 2, "one tenant at a time: assay tenant add"},
		{[]string{"replays", "dump"}, 2, "did you mean assay replay?"},
		{[]string{"work", "cancel", "--help"}, 2, `unknown work command "cancel" (it takes rerun, rest, show, list, submit, get, watch)`},
		{[]string{"work", "bogus"}, 2, `unknown work command "bogus"`},
		{[]string{"work"}, 2, "work needs a command: rerun, rest, show, list"},
		{[]string{"work", "rest", "w_1", "--region", "us", "--database-url", db}, 2, "work rest needs --cost-cap"},
		{[]string{"work", "rerun", "w_1", "--cost-cap", "5", "--region", "us", "--database-url", db}, 2, "--cost-cap is for work rest"},
		{[]string{"replay", "bogus"}, 2, `unknown replay command "bogus" (it takes dump, revalidate, redrive)`},
		{[]string{"tenant", "rename", "acme"}, 2, `unknown tenant command "rename"`},
		{[]string{"operator", "token", "mint"}, 2, `unknown operator token command "mint"`},
		{[]string{"version", "extra"}, 2, `takes no arguments, got "extra"`},
		{[]string{"tenant", "set-budget", "acme", "--usd", "-3", "--region", "us", "--database-url", db}, 2, "--usd: -3 is negative"},
		{[]string{"tenant", "add", "acme", "--home-region", "us", "--budget-usd", "-1", "--region", "us", "--database-url", db}, 2, "--budget-usd: -1 is negative"},
		{[]string{"tenant", "set-budget", "acme", "--region", "us", "--database-url", db}, 2, "exactly one of --usd N or --unlimited"},
		// A missing setting is told one way everywhere.
		{[]string{"tenant", "list", "--region", "us"}, 2, "ASSAY_DATABASE_URL (--database-url): required: the cell's Postgres URL"},
		{[]string{"work", "list", "--region", "us"}, 2, "ASSAY_DATABASE_URL (--database-url): required: the cell's Postgres URL"},
		{[]string{"usage", "reconcile"}, 2, "ASSAY_DATABASE_URL (--database-url): required: the cell's Postgres URL"},
		{[]string{"work", "show", "w_1", "--database-url", db}, 2, "ASSAY_REGION (--region): required"},
		{[]string{"streams"}, 2, "ASSAY_REGION (--region): required"},
		{[]string{"work", "list", "--region", "us", "--database-url", db, "--state", "queued,nope"}, 2, `--state: "nope" is not one of`},
		{[]string{"work", "list", "--region", "us", "--database-url", db, "--since", "1h", "--until", "2h"}, 2, "--until 2h is not after --since 1h"},
		// The development commands are in assay-dev: asked for one, help
		// or not, assay says where it went.
		{[]string{"dev"}, 2, "assay dev: the development commands are in assay-dev now"},
		{[]string{"dev", "--serve"}, 2, "make demo and make serve"},
		{[]string{"dev", "webhook", "--help"}, 2, "bin/assay-dev dev [--serve]"},
		{[]string{"bench", "goodput", "--quick"}, 2, "make bench-goodput"},
		{[]string{"bench", "--help"}, 2, "bin/assay-dev bench goodput|pipeline|parts|cells|move"},
		{[]string{"sim", "--addr", "127.0.0.1:0"}, 2, "assay sim: the development commands are in assay-dev now, which make build builds as bin/assay-dev (cmd/assay/assay-dev): bin/assay-dev sim"},
	} {
		var stderr bytes.Buffer
		code := run(c.args, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("assay %s: exit %d, stderr %q; want exit %d and %q", strings.Join(c.args, " "), code, stderr.String(), c.code, c.want)
		}
	}
	for _, args := range [][]string{{"work", "show", "--help"}, {"tenant", "--help"}, {"version", "--help"}, {"replay", "dump", "-h"}} {
		var stderr bytes.Buffer
		if code := run(args, &stderr); code != 0 {
			t.Errorf("assay %s: exit %d (%s), want its help and 0", strings.Join(args, " "), code, stderr.String())
		}
	}
}

// Every tenant command is in the general usage and in assay tenant's.
func TestUsageListsEveryTenantCommand(t *testing.T) {
	line := mainUsage[strings.Index(mainUsage, "  tenant COMMAND"):strings.Index(mainUsage, "  operator token")]
	for _, v := range tenantVerbs {
		if !strings.Contains(line, v) {
			t.Errorf("assay's usage does not list tenant %s:\n%s", v, line)
		}
		if !strings.Contains(tenantUsage, "\n  "+v+" ") && !strings.Contains(tenantUsage, "| "+v+" ") {
			t.Errorf("assay tenant's usage does not list %s", v)
		}
		if _, ok := tenantArgs[v]; !ok {
			t.Errorf("tenant %s has no argument count", v)
		}
	}
	if len(tenantArgs) != len(tenantVerbs) {
		t.Errorf("%d argument counts for %d commands", len(tenantArgs), len(tenantVerbs))
	}
	if h := helps["usage"]; strings.Contains(h, "[--since 24h]") || !strings.Contains(h, "--json") || !strings.Contains(h, "default: all time") {
		t.Errorf("assay usage's help:\n%s", h)
	}
}
