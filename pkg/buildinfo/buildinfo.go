// Package buildinfo says which build of assay is running: the version the
// build was stamped with (make build sets it from git describe), else the
// module's, and the VCS revision Go recorded.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is stamped by the build: -ldflags "-X assay.dev/pkg/buildinfo.version=…".
var version string

// Info is one build's identity.
type Info struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"goVersion"`
}

// Read returns the running build's Info.
func Read() Info {
	i := Info{Version: version, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// String is the one-line form `--version` prints: "v0.3.0 (a1b2c3d4e5f6, go1.26.8)".
func (i Info) String() string {
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if i.Modified {
		rev += "+modified"
	}
	if rev == "" {
		return fmt.Sprintf("%s (%s)", i.Version, i.GoVersion)
	}
	return fmt.Sprintf("%s (%s, %s)", i.Version, rev, i.GoVersion)
}
