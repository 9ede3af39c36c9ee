package main

import (
	"bytes"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"assay.dev/cmd/assay/internal/cell"
	"assay.dev/pkg/buildinfo"
	"assay.dev/pkg/config"
	"assay.dev/pkg/devkit/testenv"
	"assay.dev/pkg/host"
	"assay.dev/pkg/model"
	"assay.dev/pkg/placement"
	"assay.dev/services/classifier"
	"assay.dev/services/committer"
	"assay.dev/services/ingress"
	"assay.dev/services/ledger"
)

// serviceSpecs are the four services as their commands describe them to
// host.Run, as far as what they print and log before they connect.
func serviceSpecs() []host.Spec {
	var (
		in  ingress.Config
		cl  classifier.Config
		co  committer.Config
		led ledger.Config
	)
	return []host.Spec{
		{Name: "ingress", Need: config.Need{HTTPAddr: "127.0.0.1:8080"}, Vars: ingress.Vars, Configure: in.FromEnv},
		{Name: "classifier", Need: config.Need{Model: true, HTTPAddr: "127.0.0.1:8081"}, Vars: classifier.Vars, Configure: cl.FromEnv},
		{Name: "committer", Need: config.Need{HTTPAddr: "127.0.0.1:8082"}, Vars: committer.Vars, Configure: co.FromEnv},
		{Name: "ledger", Need: config.Need{HTTPAddr: "127.0.0.1:8083"}, Vars: ledger.Vars, Configure: led.FromEnv},
	}
}

// credentialSettings are a service's settings that hold a credential: the
// URL settings (each given a URL with a password of its own, its query a
// credential parameter too) and the secrets (each given a value of its
// own), with the secret each value carries.
func credentialSettings(spec host.Spec) (env map[string]string, secrets map[string]string) {
	env, secrets = map[string]string{}, map[string]string{}
	for _, v := range append(config.Shared(spec.Need), spec.Vars...) {
		pw := "Pw" + strings.ToLower(strings.ReplaceAll(v.Name, "_", ""))
		switch {
		case strings.Contains(v.Name, "DATABASE_URL"):
			env[v.Name] = "postgres://assay:" + pw + "@127.0.0.1:1/assay?sslpassword=ssl" + pw + "&connect_timeout=1"
		case strings.Contains(v.Name, "NATS_URL"):
			env[v.Name] = "nats://svc:" + pw + "@127.0.0.1:1"
		case v.Name == "ASSAY_CELL_URL":
			// A cell's address has no path or query.
			env[v.Name] = "http://cell:" + pw + "@127.0.0.1:1"
		case strings.HasSuffix(v.Name, "_URL") || strings.HasSuffix(v.Name, "_ENDPOINT"):
			// A lone user is a token, and so is the query's key.
			env[v.Name] = "http://tok" + pw + "@127.0.0.1:1/v1?api_key=key" + pw
		case config.Secret(v.Name, "opaque") && (v.Default == "" || v.Default == "none"):
			// A secret itself, not a duration named for tokens.
			env[v.Name] = "opaque" + pw
		default:
			continue
		}
		secrets[v.Name] = pw
	}
	env["ASSAY_REGION"], env["ASSAY_MODEL"], env["ASSAY_PROVIDER_BATCH"] = "us", "m", "on"
	return env, secrets
}

// leaks names each secret found in out.
func leaks(t *testing.T, what, out string, secrets map[string]string) {
	t.Helper()
	for name, pw := range secrets {
		if strings.Contains(out, pw) {
			t.Errorf("%s carries the credential of %s:\n%s", what, name, out)
		}
	}
}

// Every setting that holds a URL, and every secret, of every service is
// given a credential of its own; none is in the help, the start-up log
// line, the error of a refused setting (a bad scheme, a URL that does not
// parse, a Postgres key=value string) or a failed connection's error.
func TestNoCredentialReachesOutput(t *testing.T) {
	t.Parallel()
	info := buildinfo.Info{Version: "test"}
	var names []string
	for _, spec := range serviceSpecs() {
		env, secrets := credentialSettings(spec)
		for name := range secrets {
			names = append(names, name)
		}
		t.Run(spec.Name, func(t *testing.T) {
			t.Parallel()
			cfg, out, code := host.Configure(spec, info, nil, func(k string) string { return env[k] })
			if code != -1 {
				t.Fatalf("the settings were refused (%d): %s", code, out)
			}
			var logs bytes.Buffer
			host.LogStart(slog.New(slog.NewJSONHandler(&logs, nil)), spec, info, cfg, func(k string) string { return env[k] })
			leaks(t, "the start-up log line", logs.String(), secrets)
			if !strings.Contains(logs.String(), "xxxxx") {
				t.Errorf("the start-up log line shows no redacted value:\n%s", logs.String())
			}
			if _, out, code = host.Configure(spec, info, []string{"--help"}, func(k string) string { return env[k] }); code != 0 {
				t.Errorf("--help: code %d", code)
			}
			leaks(t, "--help", out, secrets)

			// Each URL setting refused in turn, and the database in its
			// key=value form, refused and accepted.
			for name, pw := range secrets {
				for _, bad := range []string{"ftp://svc:" + pw + "@127.0.0.1:1", "nats://svc:" + pw + "%zz@127.0.0.1:1",
					"host=127.0.0.1 port=1 user=assay password='" + pw + "' dbname=assay connect_timeout=1"} {
					getenv := func(k string) string {
						if k == name {
							return bad
						}
						return env[k]
					}
					cfg, out, code := host.Configure(spec, info, nil, getenv)
					leaks(t, name+"="+bad+": the error", out, secrets)
					if code == -1 {
						logs.Reset()
						host.LogStart(slog.New(slog.NewJSONHandler(&logs, nil)), spec, info, cfg, getenv)
						leaks(t, name+"="+bad+": the start-up log line", logs.String(), secrets)
					}
				}
			}
			// A flag's value is redacted as its variable's is.
			_, out, _ = host.Configure(spec, info, []string{"--database-url", "ftp://assay:" + secrets["ASSAY_DATABASE_URL"] + "@db"},
				func(k string) string { return env[k] })
			leaks(t, "a refused flag's error", out, secrets)
		})
	}
	for _, want := range []string{"ASSAY_DATABASE_URL", "ASSAY_NATS_URL", "ASSAY_MODEL_BASE_URL", "ASSAY_MODEL_ENDPOINT",
		"ASSAY_PLACEMENT_NATS_URL", "ASSAY_CELL_URL", "ASSAY_GITHUB_API_URL", "ASSAY_PROVIDER_BATCH_URL",
		"ASSAY_GITHUB_BUDGET_NATS_URL", "ASSAY_GITHUB_WEBHOOK_SECRET", "ASSAY_GITHUB_TOKEN", "ASSAY_MODEL_API_KEY"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s is not among the settings given a credential: %v", want, names)
		}
	}
}

// A connection that fails names where it was going without the
// credentials it carried: Postgres (URL and key=value form) and NATS at
// start-up, the region's account, the operator's tools, the model and
// GitHub.
func TestFailedConnectionCarriesNoCredential(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	secrets := map[string]string{"postgres": "PwPg1", "key=value": "PwPg2", "sslpassword": "PwPg3", "nats": "PwNats1",
		"placement": "PwPlace1", "token": "PwTok1", "api_key": "PwKey1"}
	discard := slog.New(slog.DiscardHandler)
	var errs []error
	for _, db := range []string{"postgres://assay:PwPg1@127.0.0.1:1/assay?sslpassword=PwPg3&connect_timeout=1",
		"host=127.0.0.1 port=1 user=assay password=PwPg2 dbname=assay connect_timeout=1"} {
		_, err := host.Connect(ctx, "redact", config.Config{Region: "us", DatabaseURL: db, StartupWait: 0}, discard)
		errs = append(errs, err)
		_, err = openStore(ctx, db)
		errs = append(errs, err)
	}
	nats := "nats://svc:PwNats1@127.0.0.1:1"
	_, err := host.Connect(ctx, "redact", config.Config{Region: "us", DatabaseURL: testenv.Database(t), NATSURL: nats}, discard)
	errs = append(errs, err)
	_, _, err = connectNATS(config.Config{Region: "us", NATSURL: nats})
	errs = append(errs, err)
	_, _, err = placement.Connect("nats://placement:PwPlace1@127.0.0.1:1", "redact")
	errs = append(errs, err)
	client := &model.Client{BaseURL: "http://tokPwTok1@127.0.0.1:1/v1?api_key=PwKey1", Model: "m"}
	_, err = client.Complete(ctx, model.Call{Messages: []model.Message{{Role: "user", Content: "hi"}}})
	errs = append(errs, err)
	diffs := &ingress.GitHubDiffs{API: "http://tokPwTok1@127.0.0.1:1/?access_token=PwKey1", Timeout: 5 * time.Second}
	_, err = diffs.Diff(ctx, ingress.PullRef{Owner: "o", Repo: "r", Number: 1})
	errs = append(errs, err)
	for i, err := range errs {
		if err == nil {
			t.Errorf("connection %d did not fail", i)
			continue
		}
		leaks(t, "a failed connection's error", err.Error(), secrets)
	}
}

// The dev mode refuses a bad setting before anything runs, with no
// credential in its error.
func TestDevRefusalCarriesNoCredential(t *testing.T) {
	t.Setenv("ASSAY_CELL_URL", "ftp://cell:PwDevCell@127.0.0.1:1")
	t.Setenv("ASSAY_DATABASE_URL", "postgres://assay:PwDevDb@127.0.0.1:1/assay")
	e, err := cell.StartDev(t.Context(), cell.DevOptions{LogTo: io.Discard})
	if e != nil {
		defer e.Stop()
	}
	if err == nil || !config.IsInvalid(err) {
		t.Fatalf("StartDev = %v, want a bad setting", err)
	}
	leaks(t, "the dev mode's refusal", err.Error(), map[string]string{"cell": "PwDevCell", "db": "PwDevDb"})
}
