package main

import (
	"bytes"
	"strings"
	"testing"

	"assay.dev/pkg/devkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestBadSettingsStopStartup(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"ASSAY_REGION": "us", "ASSAY_DATABASE_URL": "postgres://%zz"}, "ASSAY_DATABASE_URL"},
		{map[string]string{"ASSAY_REGION": "mars", "ASSAY_DATABASE_URL": "postgres://postgres@127.0.0.1/x"}, `ASSAY_REGION: unknown region "mars"`},
		{map[string]string{"ASSAY_REGION": "", "ASSAY_DATABASE_URL": "postgres://postgres@127.0.0.1/x"}, "ASSAY_REGION (--region): required"},
	}
	for _, tc := range cases {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		var stderr bytes.Buffer
		if code := run([]string{"migrate"}, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", tc.env, code, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: message %q does not name %s", tc.env, stderr.String(), tc.want)
		}
	}
}
