// Package buildinfo says which build of assay is running: the version the
// build was stamped with (make build sets it from git describe), else the
// module's, and the VCS revision Go recorded, else the one make build
// stamped.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and revision are stamped by the build: -ldflags "-X
// assay.dev/pkg/buildinfo.version=… -X assay.dev/pkg/buildinfo.revision=…".
// Go records the revision itself only when it builds with VCS stamping
// (not under -buildvcs=false, nor from a source tree without .git).
var version, revision string

// UnknownRevision is what logs and the build-info metric show for a build
// that carries no revision.
const UnknownRevision = "unknown"

// Info is one build's identity.
type Info struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"goVersion"`
}

// Read returns the running build's Info.
func Read() Info {
	return read(version, revision, debug.ReadBuildInfo)
}

func read(version, revision string, build func() (*debug.BuildInfo, bool)) Info {
	i := Info{Version: version, GoVersion: runtime.Version()}
	if bi, ok := build(); ok {
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
	if i.Revision == "" {
		i.Revision = revision
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// RevisionOrUnknown is the revision, or UnknownRevision for a build that
// carries none: what a log line or a metric label shows.
func (i Info) RevisionOrUnknown() string {
	if i.Revision == "" {
		return UnknownRevision
	}
	return i.Revision
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
