package config_test

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
)

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func valid() map[string]string {
	return map[string]string{
		"ASSAY_REGION":       "us",
		"ASSAY_DATABASE_URL": "postgres://assay@127.0.0.1:5432/assay?sslmode=disable",
	}
}

func with(k, v string) map[string]string {
	m := valid()
	m[k] = v
	return m
}

// quiet keeps the flag package's usage text out of the test output.
func quiet(t *testing.T) {
	t.Helper()
	old := os.Stderr
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	os.Stderr = devnull
	t.Cleanup(func() {
		os.Stderr = old
		devnull.Close()
	})
}

func TestLoadDefaults(t *testing.T) {
	t.Parallel()
	c, err := config.Load("svc", nil, env(valid()), config.Need{HTTPAddr: ":8080"})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	want := config.Config{
		Regions:        []string{"us", "eu"},
		Region:         "us",
		Cell:           "us",
		Installation:   "assay",
		DatabaseURL:    "postgres://assay@127.0.0.1:5432/assay?sslmode=disable",
		NATSURL:        "nats://127.0.0.1:4222",
		HTTPAddr:       ":8080",
		StartupWait:    time.Minute,
		MetricsTenants: 20,
		Streams:        event.StreamSettings{MaxAge: 168 * time.Hour, Duplicates: 2 * time.Minute, Replicas: 1, Wait: time.Minute},
		DatabasePool:   10,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("config = %+v, want %+v", c, want)
	}
	c, err = config.Load("svc", nil, env(valid()), config.Need{})
	if err != nil || c.HTTPAddr != "" {
		t.Fatalf("without a default listen address: %+v, %v", c, err)
	}
}

// /metrics has a listener of its own by default, the service's, and is
// never put on the API's address.
func TestMetricsAddrDefaultsApart(t *testing.T) {
	t.Parallel()
	need := config.Need{HTTPAddr: "127.0.0.1:8080", MetricsAddr: "127.0.0.1:9090"}
	c, err := config.Load("svc", nil, env(valid()), need)
	if err != nil || c.HTTPAddr != "127.0.0.1:8080" || c.MetricsAddr != "127.0.0.1:9090" {
		t.Fatalf("defaults: http %q, metrics %q, %v", c.HTTPAddr, c.MetricsAddr, err)
	}
	vars := valid()
	vars["ASSAY_METRICS_ADDR"] = "127.0.0.1:8080"
	if _, err := config.Load("svc", nil, env(vars), need); err == nil || !strings.Contains(err.Error(), "ASSAY_METRICS_ADDR") {
		t.Errorf("metrics on the API's address: %v, want ASSAY_METRICS_ADDR refused", err)
	}
	h := config.Usage("svc", "s.", need, nil)
	if !strings.Contains(h, "(default 127.0.0.1:9090)") {
		t.Errorf("the help does not give ASSAY_METRICS_ADDR's default:\n%s", h)
	}
	for _, v := range config.Shared(need) {
		if v.Name == "ASSAY_METRICS_ADDR" && v.Default != "127.0.0.1:9090" {
			t.Errorf("Shared gives ASSAY_METRICS_ADDR the default %q", v.Default)
		}
	}
}

func TestLoadFlagsOverrideEnv(t *testing.T) {
	t.Parallel()
	vars := valid()
	vars["ASSAY_NATS_URL"] = "nats://env:4222"
	vars["ASSAY_MODEL"] = "env-model"
	vars["ASSAY_MODEL_BASE_URL"] = "http://env:8000"
	vars["ASSAY_MODEL_API_KEY"] = "env-key"
	vars["ASSAY_HTTP_ADDR"] = "127.0.0.1:1"
	args := []string{"-region", "eu", "-nats-url", "tls://flag:4222", "-model", "flag-model",
		"--model-base-url=https://flag", "-model-api-key", "flag-key", "-http-addr", ":9090",
		"-database-url", "postgres://flag@db/assay"}
	c, err := config.Load("svc", args, env(vars), config.Need{Model: true, HTTPAddr: ":8080"})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	want := config.Config{
		Regions:        []string{"us", "eu"},
		Region:         "eu",
		Cell:           "eu",
		Installation:   "assay",
		DatabaseURL:    "postgres://flag@db/assay",
		NATSURL:        "tls://flag:4222",
		ModelBaseURL:   "https://flag",
		ModelAPIKey:    "flag-key",
		Model:          "flag-model",
		HTTPAddr:       ":9090",
		StartupWait:    time.Minute,
		MetricsTenants: 20,
		Streams:        event.StreamSettings{MaxAge: 168 * time.Hour, Duplicates: 2 * time.Minute, Replicas: 1, Wait: time.Minute},
		DatabasePool:   10,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("config = %+v, want %+v", c, want)
	}

	c, err = config.Load("svc", nil, env(vars), config.Need{Model: true, HTTPAddr: ":8080"})
	if err != nil {
		t.Fatalf("load from env: %v", err)
	}
	if c.NATSURL != "nats://env:4222" || c.Model != "env-model" || c.HTTPAddr != "127.0.0.1:1" || c.ModelAPIKey != "env-key" {
		t.Fatalf("env not used: %+v", c)
	}
}

// The start-up log's "effective settings" are the ones the service runs
// with: the streams' age and replicas, the pool's size (the URL's
// pool_max_conns, else 10), never zeros that stand for a default.
func TestRedactedShowsWhatRunsNotZeros(t *testing.T) {
	t.Parallel()
	c, err := config.Load("svc", nil, env(valid()), config.Need{})
	if err != nil {
		t.Fatal(err)
	}
	r := c.Redacted()
	for k, want := range map[string]any{"stream_max_age": "168h0m0s", "stream_replicas": 1, "database_pool": 10, "startup_wait": "1m0s"} {
		if r[k] != want {
			t.Errorf("%s = %v, want %v", k, r[k], want)
		}
	}
	c, err = config.Load("svc", nil, env(with("ASSAY_DATABASE_URL", "postgres://assay@db/assay?pool_max_conns=33")), config.Need{})
	if err != nil || c.Redacted()["database_pool"] != 33 {
		t.Errorf("pool_max_conns=33: database_pool %v (%v)", c.Redacted()["database_pool"], err)
	}
	vars := with("ASSAY_DATABASE_POOL", "7")
	vars["ASSAY_DATABASE_URL"] += "&pool_max_conns=33"
	if c, err = config.Load("svc", nil, env(vars), config.Need{}); err != nil || c.DatabasePool != 7 {
		t.Errorf("ASSAY_DATABASE_POOL=7 over pool_max_conns=33: %d (%v)", c.DatabasePool, err)
	}
}

// A required setting left unset is told the same way everywhere: the
// variable, its flag and what it is.
func TestMissingNamesVariableAndFlag(t *testing.T) {
	t.Parallel()
	_, err := config.Load("svc", nil, env(map[string]string{}), config.Need{Model: true})
	for _, want := range []string{"ASSAY_DATABASE_URL (--database-url): required: the cell's Postgres URL",
		"ASSAY_MODEL_BASE_URL (--model-base-url): required", "ASSAY_MODEL (--model): required", "ASSAY_REGION (--region): required: the region served by this instance, one of ASSAY_REGIONS (known: us, eu)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}

// A cluster's nodes are given as a comma-separated list, as nats.Connect
// takes them, so a service starts while any one of them answers; every
// element must be a nats:// or tls:// URL.
func TestLoadNATSURLList(t *testing.T) {
	t.Parallel()
	list := "nats://a:pw@n1:4222, nats://a:pw@n2:4222,tls://a:pw@n3:4222"
	c, err := config.Load("svc", nil, env(with("ASSAY_NATS_URL", list)), config.Need{})
	if err != nil {
		t.Fatalf("load %q: %v", list, err)
	}
	if c.NATSURL != list {
		t.Fatalf("NATSURL %q, want %q", c.NATSURL, list)
	}
	for _, bad := range []string{"nats://n1:4222,http://n2:4222", "nats://n1:4222,", "nats://n1:4222,,nats://n2:4222", "nats://n1:4222,nats://"} {
		_, err := config.Load("svc", nil, env(with("ASSAY_NATS_URL", bad)), config.Need{})
		if err == nil || !strings.Contains(err.Error(), "ASSAY_NATS_URL") {
			t.Errorf("ASSAY_NATS_URL=%q: %v, want a refusal naming ASSAY_NATS_URL", bad, err)
		}
	}
}

func TestLoadRefuses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		vars map[string]string
		args []string
		need config.Need
		want string
	}{
		{name: "missing region", vars: with("ASSAY_REGION", ""), want: "ASSAY_REGION"},
		{name: "unknown region", vars: with("ASSAY_REGION", "mars"), want: "ASSAY_REGION"},
		{name: "uppercase region", vars: with("ASSAY_REGION", "US"), want: "ASSAY_REGION"},
		{name: "missing database", vars: with("ASSAY_DATABASE_URL", ""), want: "ASSAY_DATABASE_URL"},
		{name: "unparseable database", vars: with("ASSAY_DATABASE_URL", "postgres://%zz"), want: "ASSAY_DATABASE_URL"},
		{name: "nats http scheme", vars: with("ASSAY_NATS_URL", "http://127.0.0.1:4222"), want: "ASSAY_NATS_URL"},
		{name: "nats no host", vars: with("ASSAY_NATS_URL", "nats://"), want: "ASSAY_NATS_URL"},
		{name: "nats garbage", vars: with("ASSAY_NATS_URL", "::not a url"), want: "ASSAY_NATS_URL"},
		{name: "model base missing", vars: valid(), need: config.Need{Model: true}, want: "ASSAY_MODEL_BASE_URL"},
		{name: "model name missing", vars: with("ASSAY_MODEL_BASE_URL", "https://gateway.internal/v1"), need: config.Need{Model: true}, want: "ASSAY_MODEL (--model): required"},
		{name: "model base is an endpoint", vars: with("ASSAY_MODEL_BASE_URL", "https://gw/v1/chat/completions"), need: config.Need{Model: true}, want: "set ASSAY_MODEL_ENDPOINT to ask this URL as given"},
		{name: "model endpoint scheme", vars: with("ASSAY_MODEL_ENDPOINT", "gw/v1/chat/completions"), need: config.Need{Model: true}, want: "ASSAY_MODEL_ENDPOINT"},
		{name: "model base scheme", vars: with("ASSAY_MODEL_BASE_URL", "ftp://x"), need: config.Need{Model: true}, want: "ASSAY_MODEL_BASE_URL"},
		{name: "model base no host", vars: with("ASSAY_MODEL_BASE_URL", "http://"), need: config.Need{Model: true}, want: "ASSAY_MODEL_BASE_URL"},
		{name: "http addr no port", vars: with("ASSAY_HTTP_ADDR", "localhost"), want: "ASSAY_HTTP_ADDR"},
		{name: "http addr default bad", vars: valid(), need: config.Need{HTTPAddr: "8080"}, want: "ASSAY_HTTP_ADDR"},
		{name: "bad flag value", vars: valid(), args: []string{"-region", "mars"}, want: "ASSAY_REGION"},
		{name: "stray argument", vars: valid(), args: []string{"extra"}, want: `"extra"`},
		{name: "region not listed", vars: map[string]string{"ASSAY_REGION": "ap", "ASSAY_DATABASE_URL": "postgres://x/y"}, want: "ASSAY_REGION"},
		{name: "bad regions", vars: with("ASSAY_REGIONS", "us,EU"), want: "ASSAY_REGIONS"},
		{name: "region twice", vars: with("ASSAY_REGIONS", "us,us"), want: "ASSAY_REGIONS"},
		{name: "empty region in list", vars: with("ASSAY_REGIONS", "us,,eu"), want: "ASSAY_REGIONS"},
		{name: "bad cell", vars: with("ASSAY_CELL", "us.1"), want: "ASSAY_CELL"},
		{name: "bad installation", vars: with("ASSAY_INSTALLATION", "Prod"), want: "ASSAY_INSTALLATION"},
		{name: "replicas 0", vars: with("ASSAY_STREAM_REPLICAS", "0"), want: "ASSAY_STREAM_REPLICAS"},
		{name: "replicas 7", vars: with("ASSAY_STREAM_REPLICAS", "7"), want: "ASSAY_STREAM_REPLICAS"},
		{name: "max age words", vars: with("ASSAY_STREAM_MAX_AGE", "a week"), want: "ASSAY_STREAM_MAX_AGE"},
		{name: "max age short", vars: with("ASSAY_STREAM_MAX_AGE", "1m"), want: "ASSAY_STREAM_MAX_AGE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := config.Load("svc", c.args, env(c.vars), c.need)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not name %s", err, c.want)
			}
		})
	}
}

func TestLoadNamesEveryBadSetting(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"ASSAY_REGION": "mars", "ASSAY_NATS_URL": "http://x", "ASSAY_HTTP_ADDR": "nope"}
	_, err := config.Load("svc", nil, env(vars), config.Need{Model: true})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, name := range []string{"ASSAY_REGION", "ASSAY_DATABASE_URL", "ASSAY_NATS_URL", "ASSAY_MODEL_BASE_URL", "ASSAY_HTTP_ADDR"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error %q does not name %s", err, name)
		}
	}
}

func TestLoadDoesNotEchoPassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pa55"
	urls := []string{
		"postgres://assay:" + secret + "@127.0.0.1:5432/%zz",
		"postgres://assay:" + secret + "%zz@127.0.0.1:5432/assay",
		"postgres://assay:" + secret + "@127.0.0.1:notaport/assay",
		"postgres://assay:" + secret + "@127.0.0.1:5432/assay?sslmode=bogus",
		"postgres://assay:" + secret + "@127.0.0.1:5432/assay?connect_timeout=x",
		"host=127.0.0.1 password=" + secret + " port=notaport",
	}
	for _, u := range urls {
		_, err := config.Load("svc", nil, env(with("ASSAY_DATABASE_URL", u)), config.Need{})
		if err == nil {
			t.Errorf("accepted %q", u)
			continue
		}
		if !strings.Contains(err.Error(), "ASSAY_DATABASE_URL") {
			t.Errorf("error %q does not name ASSAY_DATABASE_URL", err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error echoes the password: %q", err)
		}
	}
}

// Nor does a NATS or model URL that is refused.
func TestLoadDoesNotEchoURLPasswords(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pa55"
	for name, u := range map[string]string{
		"ASSAY_NATS_URL":       "http://assay:" + secret + "@127.0.0.1:4222",
		"ASSAY_MODEL_BASE_URL": "ftp://key:" + secret + "@models.internal/v1",
	} {
		_, err := config.Load("svc", nil, env(with(name, u)), config.Need{Model: true})
		if err == nil || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("%s %q: error %v; want it named, the password redacted", name, u, err)
		}
	}
	if got := config.Redacted("nats://a:pw1@h1:4222,nats://b:pw2@h2:4222"); got != "nats://a:xxxxx@h1:4222,nats://b:xxxxx@h2:4222" {
		t.Errorf("Redacted of a server list = %q", got)
	}
}

func TestValidateRegion(t *testing.T) {
	t.Parallel()
	for _, r := range config.DefaultRegions {
		if err := config.ValidateRegion(config.DefaultRegions, r); err != nil {
			t.Errorf("ValidateRegion(%q) = %v", r, err)
		}
	}
	for _, r := range []string{"", "mars", "US", " us", "ap"} {
		if err := config.ValidateRegion(config.DefaultRegions, r); err == nil {
			t.Errorf("ValidateRegion(%q) accepted", r)
		}
	}
}

// A region, its cell id, the installation and the streams' replicas, age
// and placement are configuration: a cell "ap" runs by configuration alone.
func TestRegionsCellAndStreamsFromConfiguration(t *testing.T) {
	t.Parallel()
	vars := valid()
	vars["ASSAY_REGIONS"] = "us, eu,ap"
	vars["ASSAY_REGION"] = "ap"
	vars["ASSAY_CELL"] = "ap-1"
	vars["ASSAY_INSTALLATION"] = "staging"
	vars["ASSAY_STREAM_REPLICAS"] = "3"
	vars["ASSAY_STREAM_MAX_AGE"] = "72h"
	vars["ASSAY_STREAM_PLACEMENT"] = "region:ap, tier:js"
	c, err := config.Load("svc", nil, env(vars), config.Need{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Regions, []string{"us", "eu", "ap"}) || c.Region != "ap" || c.Cell != "ap-1" {
		t.Fatalf("regions %v region %s cell %s", c.Regions, c.Region, c.Cell)
	}
	want := event.StreamSettings{Replicas: 3, MaxAge: 72 * time.Hour, Duplicates: 2 * time.Minute, Placement: []string{"region:ap", "tier:js"}, Wait: time.Minute}
	if !reflect.DeepEqual(c.Streams, want) {
		t.Fatalf("streams %+v, want %+v", c.Streams, want)
	}
	if n := c.Names(); n.Stream(event.KindWork) != "STAGING_WORK_AP_1" || n.Work(event.Batch, "acme") != "staging.ap-1.work.batch.acme" {
		t.Fatalf("names %+v: %s %s", n, n.Stream(event.KindWork), n.Work(event.Batch, "acme"))
	}
}

// TestLoadUnknownFlag is not parallel: it swaps os.Stderr, where the flag
// package prints its usage.
func TestLoadUnknownFlag(t *testing.T) {
	quiet(t)
	_, err := config.Load("svc", []string{"-nope"}, env(valid()), config.Need{})
	if err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("unknown flag: %v", err)
	}
}

// -h and --version are answers, not bad settings; the help lists the
// service's flags (the model's only when it calls one) and its own
// variables with their defaults.
func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"--help"}} {
		if _, err := config.Load("svc", args, env(nil), config.Need{}); !errors.Is(err, config.ErrHelp) {
			t.Errorf("%v: %v, want ErrHelp", args, err)
		}
	}
	if _, err := config.Load("svc", []string{"--version"}, env(nil), config.Need{}); !errors.Is(err, config.ErrVersion) {
		t.Errorf("--version: %v", err)
	}
	if _, err := config.Load("svc", []string{"--model", "x"}, env(valid()), config.Need{}); err == nil || !config.IsInvalid(err) {
		t.Errorf("a model flag for a service without a model: %v, want a bad setting", err)
	}
	own := []config.Var{{Name: "ASSAY_SWEEP_EVERY", Default: "5s", Usage: "how often"}}
	h := config.Usage("ingress", "ingress serves.", config.Need{HTTPAddr: "127.0.0.1:8080"}, own)
	for _, want := range []string{"--database-url", "ASSAY_DATABASE_URL", "ASSAY_STARTUP_WAIT", "ASSAY_SWEEP_EVERY", "(default 5s)", "(default 127.0.0.1:8080)"} {
		if !strings.Contains(h, want) {
			t.Errorf("help lacks %q:\n%s", want, h)
		}
	}
	if strings.Contains(h, "ASSAY_MODEL") {
		t.Errorf("a service without a model lists the model's settings:\n%s", h)
	}
	if h := config.Usage("classifier", "c.", config.Need{Model: true}, nil); !strings.Contains(h, "ASSAY_MODEL_BASE_URL") {
		t.Errorf("the classifier's help lacks the model's settings:\n%s", h)
	}
}

// Asked lists what a FromEnv reads, so a service's Vars can be held to it.
func TestAsked(t *testing.T) {
	t.Parallel()
	got := config.Asked(func(getenv func(string) string) error {
		getenv("A")
		getenv("B")
		getenv("A")
		return nil
	})
	if strings.Join(got, ",") != "A,B" {
		t.Fatalf("Asked = %v", got)
	}
}

func TestCheckVars(t *testing.T) {
	t.Parallel()
	fromEnv := func(getenv func(string) string) error {
		getenv("A")
		getenv("B")
		return nil
	}
	if p := config.CheckVars([]config.Var{{Name: "A", Default: "1", Usage: "a"}, {Name: "B", Default: "2", Usage: "b"}}, fromEnv); len(p) != 0 {
		t.Fatalf("agreeing lists: %v", p)
	}
	got := config.CheckVars([]config.Var{{Name: "A", Default: "1"}, {Name: "C", Default: "3", Usage: "c"}}, fromEnv)
	want := "A has no default or no usage,B is read but not listed,C is listed but not read"
	if strings.Join(got, ",") != want {
		t.Fatalf("CheckVars = %v, want %s", got, want)
	}
}

// A Postgres multi-host URL is shown with every host and no password: the
// later hosts are not URLs of their own, and a password may ride in the
// query.
func TestRedactedMultiHostURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://assay:s3cret@db-a:5432,db-b:5433/assay?target_session_attrs=read-write": "postgres://assay:xxxxx@db-a:5432,db-b:5433/assay?target_session_attrs=read-write",
		"postgres://assay@db-a:5432,db-b:5433/assay?password=s3cret&sslmode=verify-full":    "postgres://assay@db-a:5432,db-b:5433/assay?password=xxxxx&sslmode=verify-full",
		"nats://svc:pw@n1:4222,nats://svc:pw@n2:4222":                                       "nats://svc:xxxxx@n1:4222,nats://svc:xxxxx@n2:4222",
	} {
		if got := config.Redacted(in); got != want {
			t.Errorf("Redacted(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestChoices(t *testing.T) {
	read := func(v string) (bool, error) {
		var on bool
		err := config.Choices(func(string) string { return v }, config.Choice{Name: "ASSAY_X", Default: "on", Other: "off", To: &on})
		return on, err
	}
	for v, want := range map[string]bool{"": false, "on": false, "off": true} {
		if got, err := read(v); err != nil || got != want {
			t.Errorf("ASSAY_X=%q: %v, %v; want %v", v, got, err, want)
		}
	}
	if _, err := read("Off"); err == nil || !config.IsInvalid(err) || !strings.Contains(err.Error(), `ASSAY_X: "Off" is not on or off`) {
		t.Errorf("ASSAY_X=Off: %v; want a bad setting naming the variable and both words", err)
	}
}
