package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.yaml.in/yaml/v3"

	"assay.dev/pkg/devkit/testenv"
)

// The dashboards and rules under test, relative to this module.
const (
	grafanaDir    = "../../deploy/grafana"
	prometheusDir = "../../deploy/prometheus"
	rulesFile     = prometheusDir + "/assay.rules.yml"
	rulesTestFile = prometheusDir + "/assay.rules.test.yml"
)

// tool finds a program of Debian's prometheus package or fails the test
// saying so.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: the dashboard and alert tests need Debian's prometheus package (apt-get install prometheus)", name)
	}
	return p
}

// TestAlertRulesCheckAndUnitTests runs promtool over the rules: they load,
// and every alert has a unit test that fires it and keeps its neighbour
// quiet.
func TestAlertRulesCheckAndUnitTests(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
	rules := loadRules(t)
	tested, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range rules.alerts {
		if !strings.Contains(string(tested), "alertname: "+a.name+"\n") {
			t.Errorf("alert %s has no test in %s", a.name, rulesTestFile)
		}
		if a.forDur == "" || a.severity == "" || a.runbook == "" {
			t.Errorf("alert %s: want for:, a severity and a runbook (got %q, %q, %q)", a.name, a.forDur, a.severity, a.runbook)
		}
		anchor := strings.TrimPrefix(a.runbook, "deploy/prometheus/RUNBOOK.md#")
		if anchor != strings.ToLower(a.name) || !runbookHas(t, a.name) {
			t.Errorf("alert %s: runbook %q does not name a section of RUNBOOK.md", a.name, a.runbook)
		}
	}
}

func runbookHas(t *testing.T, alert string) bool {
	b, err := os.ReadFile(filepath.Join(prometheusDir, "RUNBOOK.md"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, []byte("\n## "+alert+"\n"))
}

// TestDashboardsAndAlertsOnRealPrometheus runs both cells' services as
// processes, two ingress replicas per cell, under a small load with broken
// answers, has a real Prometheus scrape every one of them on its metrics
// port — region coming from the services' own labels, none from the
// scrape — and evaluate the rules, then asks it every dashboard panel's
// query and every alert expression: each must parse and every panel and
// every alert's signal must return at least one series. With one item
// waiting out a long Retry-After, the lag panel must read 0; then every
// overview panel must equal the cells' databases. The spend dashboard's
// SQL runs on the cells' ledgers.
func TestDashboardsAndAlertsOnRealPrometheus(t *testing.T) {
	prom := tool(t, "prometheus")
	boards := loadDashboards(t)
	rules := loadRules(t)
	o := Options{
		Items: 120, DupKeys: 4, Load: 12 * time.Second, Seed: 7, Quiesce: 2 * time.Minute, Settle: 3 * time.Second,
		Faults:          []string{FaultModelInvalid},
		FastTimings:     true,
		IngressReplicas: 2,
		DatabaseURL:     testenv.PostgresURL(t),
		Watch: func(ctx context.Context, r Running) (func(context.Context) error, error) {
			api, err := startPrometheus(t, prom, r.Targets)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				checkPrometheus(t, ctx, api, r, boards, rules)
				return nil
			}, nil
		},
	}
	var out bytes.Buffer
	ok, err := Run(t.Context(), o, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !ok {
		t.Fatal("an invariant was violated; the table above names it")
	}
}

// startPrometheus writes a configuration scraping targets every second
// with assay's rules, starts Prometheus on a free port and waits until it
// is ready. It is stopped when the test ends.
func startPrometheus(t *testing.T, bin string, targets []Target) (string, error) {
	dir := t.TempDir()
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		return "", err
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - %s\nscrape_configs:\n", rules)
	// As in a cluster: one job per service, its pods as targets, and the
	// region each series carries from the service itself (honor_labels).
	for _, svc := range services {
		var hosts []string
		for _, tg := range targets {
			if tg.Service == svc {
				u, err := url.Parse(tg.URL)
				if err != nil {
					return "", err
				}
				hosts = append(hosts, fmt.Sprintf("%q", u.Host))
			}
		}
		fmt.Fprintf(&cfg, "  - job_name: assay-%s\n    honor_labels: true\n    static_configs:\n      - targets: [%s]\n", svc, strings.Join(hosts, ", "))
	}
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin, "--config.file="+path, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return "", err
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("prometheus log:\n%s", b)
		}
	})
	api := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(api + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return api, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("prometheus on %s not ready after 30s (last: %v)", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkPrometheus is the test's part once the run has settled.
func checkPrometheus(t *testing.T, ctx context.Context, api string, r Running, boards []dashboard, rules ruleSet) {
	// Every service is a target Prometheus scrapes successfully.
	up := waitQuery(t, ctx, api, `up{job=~"assay-.*"} == 1`, len(r.Targets))
	t.Logf("%d of %d services scraped (up == 1)", len(up), len(r.Targets))
	// The deriv rule needs two evaluations of the lag it derives from.
	waitQuery(t, ctx, api, `assay:consumer_lag:deriv10m`, 1)

	vars := regexp.MustCompile(`\$(region|cell)\b`)
	for _, b := range boards {
		for _, p := range b.Panels {
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					continue
				}
				expr := vars.ReplaceAllString(tg.Expr, ".*")
				got, err := query(ctx, api, expr)
				switch {
				case err != nil:
					t.Errorf("%s / %q: %v", b.file, p.Title, err)
				case len(got) == 0:
					t.Errorf("%s / %q: %s returns no series", b.file, p.Title, expr)
				default:
					t.Logf("%s / %q %s: %d series", b.file, p.Title, tg.RefID, len(got))
				}
			}
		}
	}
	for _, a := range rules.alerts {
		if _, err := query(ctx, api, a.expr); err != nil {
			t.Errorf("alert %s: %s: %v", a.name, a.expr, err)
		}
		signals := rules.signals(a.expr)
		if len(signals) == 0 {
			t.Errorf("alert %s reads no recorded signal", a.name)
		}
		for _, s := range signals {
			got, err := query(ctx, api, s)
			if err != nil || len(got) == 0 {
				t.Errorf("alert %s: its signal %s returns no series (%v)", a.name, s, err)
				continue
			}
			t.Logf("alert %s: signal %s has %d series", a.name, s, len(got))
		}
	}
	// Prometheus itself reports no failing rule.
	var groups struct {
		Groups []struct {
			Rules []struct{ Name, Health, LastError string }
		}
	}
	if err := apiGet(ctx, api+"/api/v1/rules", &groups); err != nil {
		t.Errorf("rules: %v", err)
	}
	for _, g := range groups.Groups {
		for _, rl := range g.Rules {
			if rl.Health != "ok" {
				t.Errorf("rule %s: health %q: %s", rl.Name, rl.Health, rl.LastError)
			}
		}
	}
	checkSpendSQL(t, ctx, r, boards)
	// Every series has the region of the service that exported it.
	if missing, err := vector(ctx, api, `count by (__name__) ({job=~"assay-.*", __name__=~"assay_.+", region=""})`); err != nil || len(missing) != 0 {
		t.Errorf("assay series without a region of their own: %v %v", missing, err)
	}
	db := openCells(t, ctx, r)
	holdOneItemBehindRetryAfter(t, ctx, r, db)
	checkLagWhileRetryAfter(t, ctx, api, r, boards)
	checkOverviewEqualsDatabase(t, ctx, api, r, boards, rules, db)
}

// checkSpendSQL runs every SQL panel on each cell's database, with
// Grafana's time filter standing for the last day; each must return rows.
func checkSpendSQL(t *testing.T, ctx context.Context, r Running, boards []dashboard) {
	timeFilter := regexp.MustCompile(`\$__timeFilter\(([a-z_.]+)\)`)
	for region, dbURL := range r.Databases {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Errorf("%s database: %v", region, err)
			continue
		}
		for _, b := range boards {
			for _, p := range b.Panels {
				for _, tg := range p.Targets {
					if tg.RawSQL == "" {
						continue
					}
					sql := timeFilter.ReplaceAllString(tg.RawSQL, "$1 > now() - interval '1 day'")
					rows, err := conn.Query(ctx, sql)
					if err != nil {
						t.Errorf("%s / %q on %s: %v", b.file, p.Title, region, err)
						continue
					}
					n := 0
					for rows.Next() {
						n++
					}
					if err := rows.Err(); err != nil {
						t.Errorf("%s / %q on %s: %v", b.file, p.Title, region, err)
					} else if n == 0 {
						t.Errorf("%s / %q on %s: no rows", b.file, p.Title, region)
					} else {
						t.Logf("%s / %q on %s: %d rows", b.file, p.Title, region, n)
					}
				}
			}
		}
		conn.Close(ctx)
	}
}

// waitQuery asks expr until it returns at least want series, for up to a
// minute, and fails the test with what it last saw.
func waitQuery(t *testing.T, ctx context.Context, api, expr string, want int) []json.RawMessage {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := query(ctx, api, expr)
		if err == nil && len(got) >= want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d series after a minute, want %d (%v)", expr, len(got), want, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// query runs an instant query and returns its result's series.
func query(ctx context.Context, api, expr string) ([]json.RawMessage, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := apiGet(ctx, api+"/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil {
		return nil, err
	}
	var series []json.RawMessage
	if data.ResultType == "vector" || data.ResultType == "matrix" {
		if err := json.Unmarshal(data.Result, &series); err != nil {
			return nil, err
		}
		return series, nil
	}
	return []json.RawMessage{data.Result}, nil // a scalar
}

func apiGet(ctx context.Context, u string, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: %w", resp.Status, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", resp.Status, env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	file       string
	UID        string `json:"uid"`
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			Type string `json:"type"`
			UID  string `json:"uid"`
		} `json:"datasource"`
		GridPos struct{ X, Y, W, H int } `json:"gridPos"`
		Targets []struct {
			RefID  string `json:"refId"`
			Expr   string `json:"expr"`
			RawSQL string `json:"rawSql"`
		} `json:"targets"`
	} `json:"panels"`
}

// loadDashboards reads every dashboard and checks its shape: unique uids
// and panel ids, a data source variable behind every panel, panels inside
// the 24-column grid, and a query in every target.
func loadDashboards(t *testing.T) []dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(grafanaDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s (%v)", grafanaDir, err)
	}
	var out []dashboard
	uids := map[string]bool{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d dashboard
		dec := json.NewDecoder(bytes.NewReader(raw))
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		d.file = filepath.Base(f)
		if d.UID == "" || uids[d.UID] {
			t.Errorf("%s: uid %q missing or used twice", d.file, d.UID)
		}
		uids[d.UID] = true
		vars := map[string]string{}
		for _, v := range d.Templating.List {
			if v.Type == "datasource" {
				vars["${"+v.Name+"}"] = fmt.Sprint(v.Query)
			}
		}
		ids := map[int]bool{}
		for _, p := range d.Panels {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d used twice", d.file, p.ID)
			}
			ids[p.ID] = true
			if kind, ok := vars[p.Datasource.UID]; !ok || kind != p.Datasource.Type {
				t.Errorf("%s / %q: data source %s/%s is not one of the dashboard's variables", d.file, p.Title, p.Datasource.Type, p.Datasource.UID)
			}
			if p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
				t.Errorf("%s / %q: gridPos %+v outside the 24-column grid", d.file, p.Title, p.GridPos)
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s / %q: no query", d.file, p.Title)
			}
			for _, tg := range p.Targets {
				if (tg.Expr == "") == (tg.RawSQL == "") {
					t.Errorf("%s / %q %s: want a PromQL expr or a SQL query", d.file, p.Title, tg.RefID)
				}
			}
		}
		out = append(out, d)
	}
	return out
}

func TestDashboardsAreWellFormed(t *testing.T) {
	boards := loadDashboards(t)
	var titles []string
	for _, b := range boards {
		titles = append(titles, b.Title)
	}
	sort.Strings(titles)
	for _, want := range []string{"assay: JetStream consumers", "assay: lanes and provider", "assay: overview", "assay: spend per tenant"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no dashboard %q (have %s)", want, strings.Join(titles, ", "))
		}
	}
}

// ruleSet is what the tests read of assay.rules.yml: recorded names and
// alerts.
type ruleSet struct {
	records []string
	exprs   map[string]string // by record
	alerts  []alertRule
}

// expr is a recorded series' expression.
func (r ruleSet) expr(t *testing.T, record string) string {
	t.Helper()
	e, ok := r.exprs[record]
	if !ok {
		t.Fatalf("no recording rule %s", record)
	}
	return e
}

type alertRule struct{ name, expr, forDur, severity, runbook string }

// signals are the recorded series expr reads.
func (r ruleSet) signals(expr string) []string {
	var out []string
	for _, rec := range r.records {
		if regexp.MustCompile(regexp.QuoteMeta(rec) + `\b`).MatchString(expr) {
			out = append(out, rec)
		}
	}
	return out
}

// loadRules reads the rule file's record and alert entries, refusing a
// field Prometheus would not know.
func loadRules(t *testing.T) ruleSet {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Name     string `yaml:"name"`
			Interval string `yaml:"interval"`
			Rules    []struct {
				Record      string            `yaml:"record"`
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	rs := ruleSet{exprs: map[string]string{}}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				rs.records = append(rs.records, r.Record)
				rs.exprs[r.Record] = strings.TrimSpace(r.Expr)
				continue
			}
			rs.alerts = append(rs.alerts, alertRule{name: r.Alert, expr: strings.TrimSpace(r.Expr), forDur: r.For,
				severity: r.Labels["severity"], runbook: r.Annotations["runbook"]})
		}
	}
	if len(rs.alerts) == 0 || len(rs.records) == 0 {
		t.Fatalf("%s: no alerts or no recording rules read", rulesFile)
	}
	return rs
}
