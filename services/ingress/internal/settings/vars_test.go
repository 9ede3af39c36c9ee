package settings

import (
	"testing"

	"assay.dev/pkg/config"
)

// Vars, which --help prints, are exactly what FromEnv reads.
func TestVarsAreWhatFromEnvReads(t *testing.T) {
	t.Parallel()
	var c Config
	for _, p := range config.CheckVars(Vars, c.FromEnv) {
		t.Error(p)
	}
}
