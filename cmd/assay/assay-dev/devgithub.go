package main

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"assay.dev/pkg/devkit/fakegithub"
	"assay.dev/pkg/evalset"
)

// devAppID is the fake GitHub App of assay-dev dev --serve.
const devAppID = 4242

// devInstallations are the fake App's installations, one per demo tenant,
// each on its tenant's repositories (the owner is the tenant's id).
var devInstallations = map[string]int64{"acme": 101, "globex": 102}

// devRepos are the demo repositories, each linked to its owner's tenant.
var devRepos = []string{"acme/shop", "globex/shop"}

// devPull is one pull request of the demo repositories.
type devPull struct {
	Repo                    string
	Number                  int64
	Title, Base, Head, Diff string
}

// devPulls are the demo repositories' pull requests: #1 to #12 in each,
// the evaluation set's diffs in order, head the item's revision and base
// a commit id derived from it, so every process agrees on them.
func devPulls() []devPull {
	var out []devPull
	for _, repo := range devRepos {
		for i, it := range evalset.Items() {
			base := sha1.Sum([]byte("base of " + it.Revision))
			out = append(out, devPull{Repo: repo, Number: int64(i + 1), Title: it.Title,
				Base: hex.EncodeToString(base[:]), Head: it.Revision, Diff: it.Diff})
		}
	}
	return out
}

// findPull is pull request number of repo among devPulls.
func findPull(repo string, number int64) (devPull, error) {
	last := int64(0)
	for _, p := range devPulls() {
		if p.Repo == repo && p.Number == number {
			return p, nil
		}
		last = max(last, p.Number)
	}
	return devPull{}, fmt.Errorf("the fake GitHub has no %s#%d: its pull requests are #1 to #%d of %v", repo, number, last, devRepos)
}

// devGitHub is the fake GitHub of assay-dev dev --serve, its App's private
// key in a directory of its own.
type devGitHub struct {
	*fakegithub.Server
	dir string
}

// startDevGitHub starts the fake GitHub with the App, its installations
// and the demo pull requests.
func startDevGitHub() (*devGitHub, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "assay-dev-github-")
	if err != nil {
		return nil, err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(filepath.Join(dir, "app.pem"), keyPEM, 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	g := &devGitHub{Server: fakegithub.New(), dir: dir}
	g.App(devAppID, &key.PublicKey)
	for tenant, id := range devInstallations {
		g.Install(id, tenant+"/*")
	}
	for _, p := range devPulls() {
		g.AddPull(p.Repo, p.Number, p.Base, p.Head, p.Diff)
	}
	return g, nil
}

// env are the settings that point the cells' ingress (diffs) and
// committer (publication) at the fake, as its App.
func (g *devGitHub) env() [][2]string {
	return [][2]string{{"ASSAY_GITHUB_API_URL", g.URL}, {"ASSAY_GITHUB_APP_ID", strconv.Itoa(devAppID)},
		{"ASSAY_GITHUB_APP_KEY_FILE", filepath.Join(g.dir, "app.pem")}}
}

// Close stops the fake and removes the App's key.
func (g *devGitHub) Close() {
	g.Server.Close()
	_ = os.RemoveAll(g.dir)
}
