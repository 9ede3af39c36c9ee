package k8s

import (
	"bytes"
	"encoding/json"
	"testing"

	"assay.dev/pkg/devkit/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// jsonLoose decodes b into v, ignoring fields v does not have.
func jsonLoose(b []byte, v any) error { return json.NewDecoder(bytes.NewReader(b)).Decode(v) }
