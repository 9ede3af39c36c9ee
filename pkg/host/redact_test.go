package host

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"assay.dev/pkg/buildinfo"
	"assay.dev/pkg/config"
)

// Why a part is not ready is logged without the credentials of any of the
// service's settings, though the part's error quotes them: a URL's
// password, whatever its setting, and a secret's whole value.
func TestReadyzReasonCarriesNoCredential(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	p := &part{}
	why := errors.New("placement: nats://placement:pl4cement-pw@10.0.0.9:4222 refused; postgres://assay:db-pw-1@db/assay; key sk-opaque-k3y")
	p.notReady.Store(&why)
	env := &Env{Log: slog.New(slog.NewJSONHandler(logs, nil)),
		Config: config.Config{DatabaseURL: "postgres://assay:db-pw-1@db/assay", ModelAPIKey: "sk-opaque-k3y"},
		own:    map[string]string{"ASSAY_PLACEMENT_NATS_URL": "nats://placement:pl4cement-pw@10.0.0.9:4222"}}
	srv := httptest.NewServer(Mux(nil, env, p))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	out := logs.String()
	for _, secret := range []string{"pl4cement-pw", "db-pw-1", "sk-opaque-k3y"} {
		if strings.Contains(out, secret) {
			t.Errorf("the not-ready reason carries %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "placement:xxxxx@10.0.0.9:4222") {
		t.Errorf("the reason no longer names where:\n%s", out)
	}
}

// A refused setting's error carries no credential, even one a check
// quotes as it is: the values of the environment and of the flags are
// scrubbed from it.
func TestConfigureErrorCarriesNoCredential(t *testing.T) {
	t.Parallel()
	env := map[string]string{"ASSAY_REGION": "us", "ASSAY_DATABASE_URL": "postgres://assay:db-pw-2@db/assay",
		"ASSAY_OWN_URL": "https://own-t0ken@own.example.com", "ASSAY_OWN_SECRET": "opaque-s3cret"}
	spec := Spec{Name: "svc", Vars: []config.Var{{Name: "ASSAY_OWN_URL", Default: "none", Usage: "a URL"}, {Name: "ASSAY_OWN_SECRET", Default: "none", Usage: "a secret"}},
		Configure: func(getenv func(string) string) error {
			return fmt.Errorf("ASSAY_OWN_URL: %s is refused beside %s and %s", getenv("ASSAY_OWN_URL"), getenv("ASSAY_OWN_SECRET"), "flag-pw-3")
		}}
	_, out, code := Configure(spec, buildinfo.Info{}, []string{"--nats-url", "nats://svc:flag-pw-3@n1:4222"}, func(k string) string { return env[k] })
	if code != 2 {
		t.Fatalf("code %d, want 2 for a refused setting: %s", code, out)
	}
	for _, secret := range []string{"own-t0ken", "opaque-s3cret", "flag-pw-3"} {
		if strings.Contains(out, secret) {
			t.Errorf("the error carries %q: %s", secret, out)
		}
	}
}
