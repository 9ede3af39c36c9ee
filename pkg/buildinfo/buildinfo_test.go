package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestReadTakesTheStampedRevisionWhenGoRecordedNone(t *testing.T) {
	noVCS := func() (*debug.BuildInfo, bool) { return &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true }
	withVCS := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "f00d"}, {Key: "vcs.modified", Value: "true"}}}, true
	}
	for _, c := range []struct {
		name               string
		version, revision  string
		build              func() (*debug.BuildInfo, bool)
		wantVersion, wantR string
		wantLabel          string
	}{
		{"stamped by make build under -buildvcs=false", "v1.2.3", "abc123", noVCS, "v1.2.3", "abc123", "abc123"},
		{"Go's own record wins", "v1.2.3", "abc123", withVCS, "v1.2.3", "f00d", "f00d"},
		{"nothing known", "", "", noVCS, "devel", "", UnknownRevision},
	} {
		t.Run(c.name, func(t *testing.T) {
			i := read(c.version, c.revision, c.build)
			if i.Version != c.wantVersion || i.Revision != c.wantR || i.RevisionOrUnknown() != c.wantLabel {
				t.Errorf("read = %+v (label %q), want version %q revision %q label %q", i, i.RevisionOrUnknown(), c.wantVersion, c.wantR, c.wantLabel)
			}
		})
	}
}
