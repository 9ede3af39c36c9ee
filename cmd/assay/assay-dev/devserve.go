package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/store"
)

const devServeUsage = `assay-dev dev --serve also prints an export line for the commands of assay,
the operator's tool (bin/assay), against the us cell as acme: ASSAY_URL and
ASSAY_TOKEN (assay work submit, get, watch, list), ASSAY_REGION, ASSAY_CELL,
ASSAY_REGIONS, ASSAY_INSTALLATION, ASSAY_DATABASE_URL and ASSAY_NATS_URL
(assay work show, tenant, usage, rollout, streams, publish, replay). They
name this run's cells: a later assay-dev dev refuses an ASSAY_DATABASE_URL
left from one.

Unless ASSAY_GITHUB_API_URL, ASSAY_GITHUB_APP_ID, ASSAY_GITHUB_APP_KEY_FILE
or ASSAY_GITHUB_TOKEN is set, it also starts a fake GitHub in the process:
its App reads the pull requests of acme/shop and globex/shop (#1 to #12, the
evaluation set's diffs) and receives the reviews, and assay-dev dev
webhook sends it deliveries.
`

// cellEnv are the variables assay's commands read to reach a cell and act
// in it, each one's value for a dev cell: what assay-dev dev --serve exports.
var cellEnv = []struct {
	name  string
	value func(c *cell.Cell, token string) string
}{
	{"ASSAY_URL", func(c *cell.Cell, _ string) string { return c.URL }},
	{"ASSAY_TOKEN", func(_ *cell.Cell, token string) string { return token }},
	{"ASSAY_REGION", func(c *cell.Cell, _ string) string { return c.Env.Config.Region }},
	{"ASSAY_CELL", func(c *cell.Cell, _ string) string { return c.Env.Config.Cell }},
	{"ASSAY_REGIONS", func(c *cell.Cell, _ string) string { return strings.Join(c.Env.Config.Regions, ",") }},
	{"ASSAY_INSTALLATION", func(c *cell.Cell, _ string) string { return c.Env.Config.Installation }},
	{"ASSAY_DATABASE_URL", func(c *cell.Cell, _ string) string { return withoutPassword(c.Env.Config.DatabaseURL) }},
	{"ASSAY_NATS_URL", func(c *cell.Cell, _ string) string { return c.Env.Config.NATSURL }},
}

// exportLine is the shell line that sets cellEnv for tenant's home cell.
func exportLine(e *cell.Dev, tenant string) string {
	var home, token string
	for _, t := range e.Tenants {
		if t.ID == tenant {
			home, token = t.HomeRegion, t.Token
		}
	}
	c := e.Cells[home]
	parts := []string{"export"}
	for _, v := range cellEnv {
		parts = append(parts, v.name+"="+shellQuote(v.value(c, token)))
	}
	return strings.Join(parts, " ")
}

// withoutPassword is a database URL with any password taken out: the
// export line is printed, so a password set in ASSAY_DATABASE_URL is
// given as PGPASSWORD instead (printDevCommands says so).
func withoutPassword(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	if _, set := u.User.Password(); set {
		u.User = url.User(u.User.Username())
	}
	return u.String()
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]*$`)

// shellQuote quotes s for a POSIX shell when it needs quoting.
func shellQuote(s string) string {
	if s != "" && shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// leftoverExport refuses an ASSAY_DATABASE_URL that names a dev cell's
// database, as the export line of an earlier assay-dev dev --serve leaves it:
// assay-dev dev makes its own, and that run's server may be gone.
func leftoverExport() error {
	u, err := url.Parse(os.Getenv("ASSAY_DATABASE_URL"))
	if err != nil {
		return nil
	}
	if db := strings.TrimPrefix(u.Path, "/"); strings.HasPrefix(db, "assay_dev_") {
		return fmt.Errorf("ASSAY_DATABASE_URL names database %s, a cell of an earlier assay-dev dev --serve (its export line): "+
			"assay-dev dev makes its cells' databases itself; unset ASSAY_DATABASE_URL (for a throwaway server), or set it to a server's postgres database", db)
	}
	return nil
}

// serving is a running assay-dev dev --serve: the cells, the fake GitHub they
// read diffs from and publish to (nil when the user's GitHub settings are
// set), and the run file that tells assay-dev dev webhook where they are.
type serving struct {
	*cell.Dev
	gh      *devGitHub
	runFile string
	own     string // the GitHub setting of the user's that leaves the fake out
}

// startServing starts the fake GitHub, points the cells' GitHub settings
// at it, starts the cells and links each demo tenant's installation. On
// an error the serving it returns, if any, must still be stopped.
func startServing(ctx context.Context, o cell.DevOptions, runFile string) (*serving, error) {
	s := &serving{runFile: runFile, own: ownGitHub()}
	if s.own == "" {
		gh, err := startDevGitHub()
		if err != nil {
			return s, fmt.Errorf("fake GitHub: %w", err)
		}
		s.gh = gh
		for _, kv := range gh.env() {
			if err := os.Setenv(kv[0], kv[1]); err != nil {
				return s, err
			}
		}
	}
	e, err := cell.StartDev(ctx, o)
	s.Dev = e
	if err != nil {
		return s, err
	}
	if s.gh != nil {
		for _, c := range e.Cells {
			for tenant, id := range devInstallations {
				if err := c.Env.Store.LinkSource(ctx, store.Link{Kind: store.SourceGitHubInstallation, Key: fmt.Sprint(id),
					Tenant: tenant, Repositories: []string{tenant + "/*"}}); err != nil {
					return s, err
				}
			}
		}
	}
	return s, s.writeRun()
}

// Stop stops the cells, then the fake GitHub, and removes the run file.
func (s *serving) Stop() {
	if s.Dev != nil {
		s.Dev.Stop()
	}
	if s.gh != nil {
		s.gh.Close()
	}
	if r, err := readServeRun(s.runFile); err == nil && r.PID == os.Getpid() {
		_ = os.Remove(s.runFile)
	}
}

// ownGitHub is the first GitHub setting of the user's that is set: then
// serve uses that GitHub, not the fake.
func ownGitHub() string {
	for _, k := range []string{"ASSAY_GITHUB_API_URL", "ASSAY_GITHUB_APP_ID", "ASSAY_GITHUB_APP_KEY_FILE", "ASSAY_GITHUB_TOKEN"} {
		if os.Getenv(k) != "" {
			return k
		}
	}
	return ""
}

// serveRun is what assay-dev dev webhook reads of a running assay-dev dev --serve.
type serveRun struct {
	PID int `json:"pid"`
	// Cells are the cells' URLs by region, Homes each demo tenant's
	// home region.
	Cells map[string]string `json:"cells"`
	Homes map[string]string `json:"homes"`
	// GitHub is the fake GitHub's URL, "" when serve uses the user's.
	GitHub string `json:"github,omitempty"`
	// Secrets is the file that keeps the tokens and the webhook secret,
	// "" under --fresh.
	Secrets string `json:"secrets,omitempty"`
}

// devRunFile is where assay-dev dev --serve says where it runs, beside the
// file that keeps its secrets ("" when there is no cache directory).
func devRunFile() string {
	if f := devSecretsFile(); f != "" {
		return filepath.Join(filepath.Dir(f), "dev-serve-run.json")
	}
	return ""
}

func (s *serving) writeRun() error {
	if s.runFile == "" {
		return nil
	}
	r := serveRun{PID: os.Getpid(), Cells: map[string]string{}, Homes: map[string]string{}, Secrets: s.Secrets}
	for region, c := range s.Cells {
		r.Cells[region] = c.URL
	}
	for _, t := range s.Tenants {
		r.Homes[t.ID] = t.HomeRegion
	}
	if s.gh != nil {
		r.GitHub = s.gh.URL
	}
	raw, _ := json.MarshalIndent(r, "", "  ")
	if err := os.MkdirAll(filepath.Dir(s.runFile), 0o700); err != nil {
		return err
	}
	return os.WriteFile(s.runFile, append(raw, '\n'), 0o600)
}

// readServeRun reads the run file of the assay-dev dev --serve running now.
func readServeRun(file string) (serveRun, error) {
	var r serveRun
	if file == "" {
		return r, errors.New("no cache directory, so no assay-dev dev --serve can say where it runs; give the cell with --url")
	}
	raw, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return r, fmt.Errorf("no assay-dev dev --serve is running (%s is missing): start one with make serve", file)
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("%s: %w", file, err)
	}
	return r, nil
}

// printCommands prints, below the endpoints, the export line for assay's
// own commands and the GitHub path.
func (s *serving) printCommands(w io.Writer) {
	tenant := s.Tenants[0]
	fmt.Fprintf(w, "\n  for assay's commands (bin/assay: work submit|get|watch|list, work show, tenant, usage, rollout, streams, …) against cell %s as %s:\n",
		tenant.HomeRegion, tenant.ID)
	fmt.Fprintf(w, "    %s\n", exportLine(s.Dev, tenant.ID))
	if u, err := url.Parse(s.Cells[tenant.HomeRegion].Env.Config.DatabaseURL); err == nil && u.User != nil {
		if _, set := u.User.Password(); set {
			fmt.Fprintln(w, "    (ASSAY_DATABASE_URL's password is left out: export PGPASSWORD as well)")
		}
	}
	fmt.Fprintln(w, "    (they name this run's cells: a later assay-dev dev refuses the ASSAY_DATABASE_URL; unset it first)")
	self := selfName()
	if s.gh == nil {
		fmt.Fprintf(w, "\n  GitHub: %s is set, so the cells read diffs from and publish to your GitHub, not the fake one\n", s.own)
	} else {
		fmt.Fprintf(w, "\n  GitHub (fake, in this process)  %s\n", s.gh.URL)
		fmt.Fprintf(w, "    App %d; installation %d on acme/*, %d on globex/*; pull requests #1 to #%d in acme/shop and globex/shop\n",
			devAppID, devInstallations["acme"], devInstallations["globex"], len(devPulls())/len(devRepos))
		fmt.Fprintf(w, "    GET %s/repos/acme/shop/pulls/1/reviews (any Authorization: token …) lists the reviews posted\n", s.gh.URL)
	}
	fmt.Fprintf(w, "    a signed pull_request delivery to the repository's cell, then its outcome and what GitHub got:\n")
	fmt.Fprintf(w, "    %s dev webhook --repo acme/shop --pr 1 --wait\n", self)
}

// selfName is how to run this assay-dev again: as it was started, unless
// go run or go test built it into a temporary directory.
func selfName() string {
	if a := os.Args[0]; !strings.HasPrefix(a, os.TempDir()) && a != "" {
		return a
	}
	return "assay-dev"
}

// assayName is how to run assay, the operator's tool, beside this
// assay-dev: bin/assay for bin/assay-dev, else assay.
func assayName() string {
	if self := selfName(); strings.HasSuffix(self, "assay-dev") {
		return strings.TrimSuffix(self, "-dev")
	}
	return "assay"
}
