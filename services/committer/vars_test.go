package committer

import (
	"slices"
	"testing"

	"assay.dev/pkg/config"
)

// Vars, which --help prints, are exactly what FromEnv reads.
func TestVarsAreWhatFromEnvReads(t *testing.T) {
	t.Parallel()
	var c Config
	asked := config.Asked(c.FromEnv)
	var listed []string
	for _, v := range Vars {
		listed = append(listed, v.Name)
		if v.Default == "" || v.Usage == "" {
			t.Errorf("%s has no default or no usage", v.Name)
		}
	}
	slices.Sort(asked)
	slices.Sort(listed)
	if !slices.Equal(asked, listed) {
		t.Errorf("FromEnv reads %v, Vars list %v", asked, listed)
	}
}
