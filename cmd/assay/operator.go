package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"assay.dev/cmd/assay/internal/cli"
	"assay.dev/pkg/config"
	"assay.dev/pkg/store"
)

const operatorUsage = `usage: assay operator token <command> [flags] [--region R --database-url URL]

  create --name NAME [--role operator|reviewer] [--token-from FILE] [--token-out FILE]
                   a new operator token for NAME, printed once (or written to
                   --token-out, mode 0600); --token-from installs the token
                   minted in another cell, so one token reads every cell;
                   --role reviewer reads the console and acts on no work
                   (default operator: redrive, rerun and cancel from a
                   work's page)
  list [--json]    the operator tokens, revoked ones too (never the tokens)
  revoke --name NAME
                   revoke NAME's token; its console streams end

An operator token is not a tenant's: it reads the whole cell's console
(GET /console, /v1/console) and, of role operator, redrives, reruns and
cancels work from a work's page; the tenant APIs refuse it (403 operator_token). Operator tokens are per cell, like tenants: run each
command against every cell.

Settings: --region (ASSAY_REGION) and --database-url (ASSAY_DATABASE_URL).
`

// operatorCmd runs `assay operator token …` against the cell in
// ASSAY_DATABASE_URL.
func operatorCmd(ctx context.Context, args []string, stdout io.Writer) error {
	if cli.IsHelp(args) {
		fmt.Fprint(stdout, operatorUsage)
		return nil
	}
	if len(args) == 0 || args[0] != "token" {
		return tool.UnknownSub("operator", args)
	}
	if len(args) < 2 || !slices.Contains([]string{"create", "list", "revoke"}, args[1]) {
		what := "operator token needs a command"
		if len(args) >= 2 {
			what = fmt.Sprintf("unknown operator token command %q", args[1])
		}
		return cli.ConfigError{Err: fmt.Errorf("%s (it takes create, list, revoke)\n%s", what, operatorUsage)}
	}
	verb := args[1]
	fs := flag.NewFlagSet("assay operator token "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("name", "", "whose token it is")
	tokenFrom := fs.String("token-from", "", "install the token in FILE (- for standard input) instead of minting one")
	tokenOut := fs.String("token-out", "", "write the new token to FILE (mode 0600) instead of printing it")
	asJSON := fs.Bool("json", false, "list as JSON")
	role := fs.String("role", store.RoleOperator, "create: operator (acts on work from the console) or reviewer (reads it)")
	region := fs.String("region", os.Getenv("ASSAY_REGION"), "cell ($ASSAY_REGION)")
	dbURL := fs.String("database-url", os.Getenv("ASSAY_DATABASE_URL"), "the cell's Postgres ($ASSAY_DATABASE_URL)")
	if err := fs.Parse(args[2:]); err != nil {
		return cli.ConfigError{Err: fmt.Errorf("%v\n%s", err, operatorUsage)}
	}
	if fs.NArg() > 0 {
		return cli.ConfigError{Err: fmt.Errorf("operator token %s takes no arguments, got %q\n%s", verb, fs.Args(), operatorUsage)}
	}
	if err := checkOperatorFlags(verb, *name, *role); err != nil {
		return err
	}
	if _, err := config.Load("assay operator", []string{"--region", *region, "--database-url", *dbURL}, regionsOnly, config.Need{}); err != nil {
		return cli.ConfigError{Err: err}
	}
	st, err := store.Open(ctx, *dbURL)
	if err != nil {
		return fmt.Errorf("ASSAY_DATABASE_URL: %w", err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	switch verb {
	case "create":
		tok, err := token(*tokenFrom)
		if err != nil {
			return err
		}
		if err := st.AddOperatorTokenAs(ctx, *name, *role, tok); err != nil {
			if errors.Is(err, store.ErrExists) {
				return fmt.Errorf("%v in region %s's database (revoke the old one first)", err, *region)
			}
			return err
		}
		fmt.Fprintf(stdout, "%s token for %s created; it reads the console of region %s\n", *role, *name, *region)
		return showToken(stdout, tok, *tokenFrom, *tokenOut)
	case "revoke":
		if err := st.RevokeOperatorToken(ctx, *name); errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("operator %s has no active token in region %s's database", *name, *region)
		} else if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "operator token of %s revoked\n", *name)
		return nil
	}
	toks, err := st.OperatorTokens(ctx)
	if err != nil {
		return err
	}
	return printOperatorTokens(stdout, toks, *asJSON)
}

// checkOperatorFlags refuses a name or role verb cannot take.
func checkOperatorFlags(verb, name, role string) error {
	if (verb == "create" || verb == "revoke") && !store.ValidOperatorName(name) {
		return cli.ConfigError{Err: fmt.Errorf("--name %q: use 1-63 lowercase letters, digits and ._-, starting with a letter or digit", name)}
	}
	if !slices.Contains(store.Roles, role) {
		return cli.ConfigError{Err: fmt.Errorf("--role %q: use operator or reviewer", role)}
	}
	return nil
}

// printOperatorTokens lists toks as a table, or as JSON.
func printOperatorTokens(stdout io.Writer, toks []store.OperatorToken, asJSON bool) error {
	if asJSON {
		if toks == nil {
			toks = []store.OperatorToken{}
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(toks)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tCREATED\tREVOKED")
	for _, t := range toks {
		revoked := "-"
		if t.RevokedAt != nil {
			revoked = t.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.Role, t.CreatedAt.UTC().Format(time.RFC3339), revoked)
	}
	return tw.Flush()
}
