package config_test

import (
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"assay.dev/pkg/config"
)

// A value is redacted by what it is, whatever its setting: a URL's
// password, a lone user (a token, except a Postgres role) and its
// credential parameters; a Postgres key=value string's; any other value
// as it is.
func TestRedactedByWhatTheValueIs(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://svc:pw@n1:4222":                                    "nats://svc:xxxxx@n1:4222",
		"tls://s3cr3ttoken@n1:4222":                                "tls://xxxxx@n1:4222",
		"https://ghp_t0ken@ghe.example.com/api/v3":                 "https://xxxxx@ghe.example.com/api/v3",
		"https://x-access-token:ghp_t0ken@ghe.example.com":         "https://x-access-token:xxxxx@ghe.example.com",
		"postgres://assay@db/assay?sslpassword=kp&sslmode=require": "postgres://assay@db/assay?sslpassword=xxxxx&sslmode=require",
		"https://api.example.com/v1?api_key=k1&region=us":          "https://api.example.com/v1?api_key=xxxxx&region=us",
		"https://h/v1?access_token=a&token=b&secret=c&key=d&pwd=e": "https://h/v1?access_token=xxxxx&token=xxxxx&secret=xxxxx&key=xxxxx&pwd=xxxxx",
		"nats://a:pw1@h1:4222, nats://b:pw2@h2:4222":               "nats://a:xxxxx@h1:4222,nats://b:xxxxx@h2:4222",
		"svc:pw@n1:4222":       "svc:xxxxx@n1:4222",
		"nats://u:p%zz@h:4222": "(a value that does not parse as a URL)",
		"host=db user=assay password=s3cret dbname=assay":            "host=db user=assay password=xxxxx dbname=assay",
		`host=db password='s3 cr\'et' sslpassword=kp sslmode=verify`: "host=db password=xxxxx sslpassword=xxxxx sslmode=verify",
		"host = db password = s3cret":                                "host = db password = xxxxx",
		"https://api.github.com":                                     "https://api.github.com",
		"30s":                                                        "30s",
		"us, eu":                                                     "us, eu",
		"/etc/assay/prices.json":                                     "/etc/assay/prices.json",
		"127.0.0.1:8080":                                             "127.0.0.1:8080",
		"":                                                           "",
	} {
		if got := config.Redacted(in); got != want {
			t.Errorf("Redacted(%q) = %q, want %q", in, got, want)
		}
	}
}

// A setting named for an opaque secret shows only that it is set; any
// other is shown as Redacted shows its value.
func TestRedactedSetting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, value, want string }{
		{"ASSAY_GITHUB_WEBHOOK_SECRET", "whsec", "(set)"},
		{"ASSAY_GITHUB_TOKEN", "ghp_x", "(set)"},
		{"ASSAY_MODEL_API_KEY", "sk-x", "(set)"},
		{"ASSAY_GITHUB_API_URL", "https://t0k@ghe.example.com", "https://xxxxx@ghe.example.com"},
		{"ASSAY_ACK_WAIT", "30s", "30s"},
		{"ASSAY_GITHUB_TOKEN", "", ""},
		{"ASSAY_TOKEN_CACHE", "2s", "2s"},
		{"ASSAY_GITHUB_APP_KEY_FILE", "/etc/assay/app.pem", "/etc/assay/app.pem"},
	} {
		if got := config.RedactedSetting(c.name, c.value); got != c.want {
			t.Errorf("RedactedSetting(%s, %q) = %q, want %q", c.name, c.value, got, c.want)
		}
	}
}

// A library's message that quotes a value is scrubbed of the value's
// credentials, plain or escaped, even when the value does not parse.
func TestScrub(t *testing.T) {
	t.Parallel()
	for value, secrets := range map[string][]string{
		"postgres://a:s3cr%40t@h/db?password=qp4ss":          {"s3cr@t", "s3cr%40t", "qp4ss"},
		"nats://u:p%zzpw@h:4222":                             {"p%zzpw"},
		"host=db password='quoted pw' sslpassword=k3ypass":   {"quoted pw", "k3ypass"},
		"https://t0kenonly@ghe.example.com/?access_token=at": {"t0kenonly", "at"},
		"postgres://assay:c0mma,pw@db/assay":                 {"c0mma,pw"},
	} {
		msg := "cannot use " + value + " (" + strings.Join(secrets, ", ") + ")"
		got := config.Scrub(msg, value)
		for _, s := range secrets {
			if strings.Contains(got, s) {
				t.Errorf("Scrub(%q) = %q: %q is still there", msg, got, s)
			}
		}
	}
	if got := config.Scrub("dial tcp 10.0.0.1:5432: refused", "postgres://assay@10.0.0.1/assay"); got != "dial tcp 10.0.0.1:5432: refused" {
		t.Errorf("a message without credentials changed: %q", got)
	}
}

// net/http's error keeps a lone user (a token) and the query in the URL
// it names; RedactError keeps them out and errors.Is still sees the cause.
func TestRedactErrorOfAFailedRequest(t *testing.T) {
	t.Parallel()
	_, err := http.Get("http://t0kenuser@127.0.0.1:1/v1?access_token=acc3ss")
	if err == nil {
		t.Fatal("a request to a closed port answered")
	}
	err = config.RedactError(err)
	if s := err.Error(); strings.Contains(s, "t0kenuser") || strings.Contains(s, "acc3ss") || !strings.Contains(s, "xxxxx@127.0.0.1:1") {
		t.Errorf("error %q: want the token and the query's credential redacted", s)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v: errors.Is no longer sees the refusal", err)
	}
	if config.RedactError(nil) != nil {
		t.Error("RedactError(nil) is not nil")
	}
}
