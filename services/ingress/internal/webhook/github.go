package webhook

import (
	"context"

	"assay.dev/pkg/store"
)

// diffInstallation is the App installation that reads a delivery's pull
// request: the one that delivered it, when the App signed the delivery, or
// else the one its tenant linked for the repository; 0 without an App.
func (s *Room) diffInstallation(ctx context.Context, d *delivery) (int64, error) {
	if d.pr.Installation != nil && d.by.app {
		return d.pr.Installation.ID, nil
	}
	if s.Cfg.GitHubAppID == 0 {
		return 0, nil
	}
	return s.D.Store.InstallationFor(ctx, d.tenant.ID, d.pr.Repository.FullName)
}

// covers reports whether one of an installation's repository patterns
// names repo.
func covers(patterns []string, repo string) bool { return store.Covers(patterns, repo) }
