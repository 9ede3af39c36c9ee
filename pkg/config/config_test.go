package config_test

import (
	"os"
	"strings"
	"testing"

	"assay.dev/pkg/config"
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
		Region:      "us",
		DatabaseURL: "postgres://assay@127.0.0.1:5432/assay?sslmode=disable",
		NATSURL:     "nats://127.0.0.1:4222",
		Model:       "assay-sim-1",
		HTTPAddr:    ":8080",
	}
	if c != want {
		t.Fatalf("config = %+v, want %+v", c, want)
	}
	c, err = config.Load("svc", nil, env(valid()), config.Need{})
	if err != nil || c.HTTPAddr != "" {
		t.Fatalf("without a default listen address: %+v, %v", c, err)
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
		Region:       "eu",
		DatabaseURL:  "postgres://flag@db/assay",
		NATSURL:      "tls://flag:4222",
		ModelBaseURL: "https://flag",
		ModelAPIKey:  "flag-key",
		Model:        "flag-model",
		HTTPAddr:     ":9090",
	}
	if c != want {
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
		{name: "model base scheme", vars: with("ASSAY_MODEL_BASE_URL", "ftp://x"), need: config.Need{Model: true}, want: "ASSAY_MODEL_BASE_URL"},
		{name: "model base no host", vars: with("ASSAY_MODEL_BASE_URL", "http://"), need: config.Need{Model: true}, want: "ASSAY_MODEL_BASE_URL"},
		{name: "http addr no port", vars: with("ASSAY_HTTP_ADDR", "localhost"), want: "ASSAY_HTTP_ADDR"},
		{name: "http addr default bad", vars: valid(), need: config.Need{HTTPAddr: "8080"}, want: "ASSAY_HTTP_ADDR"},
		{name: "bad flag value", vars: valid(), args: []string{"-region", "mars"}, want: "ASSAY_REGION"},
		{name: "stray argument", vars: valid(), args: []string{"extra"}, want: `"extra"`},
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

func TestValidateRegion(t *testing.T) {
	t.Parallel()
	for _, r := range config.Regions {
		if err := config.ValidateRegion(r); err != nil {
			t.Errorf("ValidateRegion(%q) = %v", r, err)
		}
	}
	for _, r := range []string{"", "mars", "US", " us"} {
		if err := config.ValidateRegion(r); err == nil {
			t.Errorf("ValidateRegion(%q) accepted", r)
		}
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
