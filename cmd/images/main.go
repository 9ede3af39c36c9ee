// Command images builds the container images of assay's five binaries —
// the operator's tool assay and the services ingress, classifier, committer
// and ledger — without pulling a base image and without a container runtime.
//
// Each binary is built statically (CGO_ENABLED=0, GOOS=linux, -trimpath,
// stamped with the version like make build) and put on an empty image in two
// layers: a base layer shared by all five (the build machine's CA bundle at
// /etc/ssl/certs/ca-certificates.crt, /etc/passwd and /etc/group with the
// user nonroot, uid and gid 65532, its home /home/nonroot, and /tmp with mode
// 1777), then the binary at /usr/local/bin/<name>, mode 0755, owned by root.
// The image runs the binary as 65532:65532; a service's image listens on all
// interfaces at its default ports (ASSAY_HTTP_ADDR=:8080 for ingress, :8081
// classifier, :8082 committer, :8083 ledger; ASSAY_METRICS_ADDR=:9090 to
// :9093, /metrics on a listener of its own) and exposes both.
//
// Tar entries are sorted and carry one fixed time (SOURCE_DATE_EPOCH, else
// the Unix epoch), as does the image config, so building the same source
// twice gives the same digests.
//
// The images are named and tagged as the Kubernetes manifests pull them:
// deploy/k8s/components/images/kustomization.yaml gives each binary's
// newName (<repo>/<binary>) and the one newTag, and those are the defaults
// of -repo and -version, so the images a fresh clone builds are the ones its
// manifests name. Change the registry or the tag there, once, for both.
//
// The output is an OCI image layout (default bin/images under the repository
// root) holding the five images, each named by its
// org.opencontainers.image.ref.name annotation, for example
// registry.invalid/assay/ingress:0.1.0; -tar also writes one tarball that
// docker load reads; -list prints the names and builds nothing.
//
//	cd cmd/images && go run . -tar ../../bin/images.tar
//
// go run . -h lists the flags.
package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// target is one binary and the image made from it.
type target struct {
	Name   string // binary and image name
	Module string // module directory, relative to the repository root
	Pkg    string // main package, relative to Module
	// Port is the port of the binary's default ASSAY_HTTP_ADDR
	// (config.Need.HTTPAddr in its main.go); 0 for a binary that serves none.
	Port int
	// MetricsPort is the port of its default ASSAY_METRICS_ADDR
	// (config.Need.MetricsAddr), the listener /metrics has to itself.
	MetricsPort int
	Doc         string
}

var targets = []target{
	{Name: "assay", Module: "cmd/assay", Pkg: ".", Doc: "assay operator tool: tenants, credentials, NATS configuration, usage"},
	{Name: "ingress", Module: "services/ingress", Pkg: "./cmd/ingress", Port: 8080, MetricsPort: 9090, Doc: "assay ingress: one cell's API, GitHub webhooks and usage"},
	{Name: "classifier", Module: "services/classifier", Pkg: "./cmd/classifier", Port: 8081, MetricsPort: 9091, Doc: "assay classifier: claims work and calls the model"},
	{Name: "committer", Module: "services/committer", Pkg: "./cmd/committer", Port: 8082, MetricsPort: 9092, Doc: "assay committer: gates and commits results"},
	{Name: "ledger", Module: "services/ledger", Pkg: "./cmd/ledger", Port: 8083, MetricsPort: 9093, Doc: "assay ledger: attempts, usage and budgets"},
}

// The image's user and file system.
const (
	binDir      = "/usr/local/bin"
	caPath      = "/etc/ssl/certs/ca-certificates.crt"
	uid, gid    = 65532, 65532
	userName    = "nonroot"
	homeDir     = "/home/nonroot"
	imagePath   = "/usr/local/bin:/usr/bin:/bin"
	versionVar  = "assay.dev/pkg/buildinfo.version"
	refNameAnno = "org.opencontainers.image.ref.name"
)

// arches are the GOARCH values an image may be built for.
var arches = []string{"amd64", "arm64", "ppc64le", "riscv64", "s390x"}

// tagRE is what an image tag may be (the distribution spec's rule).
var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// options say what to build and where.
type options struct {
	Root     string    // repository root (holds go.work)
	Out      string    // OCI layout directory
	Tar      string    // docker-loadable tarball; "" for none
	Version  string    // version stamp, image tag and label
	Revision string    // VCS revision label; "" for none
	Source   string    // source URL label; "" for none
	Arch     string    // GOARCH
	Repo     string    // image names are Repo/<name>:Version
	Go       string    // go command
	Jobs     int       // binaries built at once
	CABundle string    // CA bundle copied into the images
	Epoch    time.Time // every file's mtime and the image's created time
	List     bool      // print the image names and build nothing
}

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(1)
	}
}

// run parses args, builds the images and writes them.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.List {
		for _, t := range targets {
			fmt.Fprintln(stdout, imageRef(o, t))
		}
		return nil
	}
	// Everything that can be wrong without building is checked first.
	base, err := baseLayer(o)
	if err != nil {
		return err
	}
	if err := checkOut(o.Out); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "assay-images-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	bins, err := buildBinaries(ctx, o, tmp, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "built %d binaries for linux/%s in %s\n", len(bins), o.Arch, time.Since(start).Round(100*time.Millisecond))
	imgs, err := buildImages(o, base, bins)
	if err != nil {
		return err
	}
	if err := writeLayout(o.Out, imgs); err != nil {
		return err
	}
	for _, im := range imgs {
		d, _ := im.Image.Digest()
		size, err := imageSize(im.Image)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%-32s %s %6.1f MB\n", im.Ref, d, float64(size)/1e6)
	}
	fmt.Fprintf(stdout, "wrote the OCI image layout %s\n", o.Out)
	if o.Tar != "" {
		if err := writeTar(o.Tar, imgs); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s (docker load -i %s)\n", o.Tar, o.Tar)
	}
	return nil
}

// parseFlags reads the flags, filling in what they leave out from the
// repository (root, version, revision, source) and the environment
// (SOURCE_DATE_EPOCH).
func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := o.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (images takes only flags; -h lists them)", fs.Arg(0))
	}
	err := o.validate()
	return o, err
}

// flagSet is the flag set that fills o, its usage written to stderr.
func (o *options) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Root, "root", "", "repository root, the directory holding go.work (default: found above the working directory)")
	fs.StringVar(&o.Out, "out", "", "OCI image layout directory to write; replaced if it holds one already (default <root>/bin/images)")
	fs.StringVar(&o.Tar, "tar", "", "also write this docker-loadable tarball of all five images (docker load -i FILE)")
	fs.StringVar(&o.Version, "version", "", "version stamped into the binaries (--version), used as the image tag and label (default: the newTag of "+componentFile+")")
	fs.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision label (default: git rev-parse HEAD, none outside git)")
	fs.StringVar(&o.Source, "source", "", "org.opencontainers.image.source label (default: the git remote origin's URL, none without one)")
	fs.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH of the binaries and images, one of "+strings.Join(arches, ", "))
	fs.StringVar(&o.Repo, "repo", "", "repository prefix of the image names: <repo>/<binary>:<version> (default: the newName prefix of "+componentFile+")")
	fs.BoolVar(&o.List, "list", false, "print the names of the images it would build, one a line, and build nothing")
	fs.StringVar(&o.Go, "go", "go", "go command that builds the binaries")
	fs.IntVar(&o.Jobs, "j", 2, "binaries built at once")
	fs.StringVar(&o.CABundle, "ca", caPath, "CA bundle of the build machine, copied to "+caPath+" in the images")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: images [flags]

images builds the container images of assay, ingress, classifier, committer
and ledger from static binaries on an empty base, and writes them as one OCI
image layout (and with -tar as a docker-loadable tarball). Files and the image
config carry the time SOURCE_DATE_EPOCH (seconds; default 0), so the same
source gives the same digests.

`)
		fs.PrintDefaults()
	}
	return fs
}

// validate checks the flags and fills in what they leave out: the root
// found above the working directory, the output under it, the version and
// repository from the manifests, the revision and source from git, and the
// epoch from SOURCE_DATE_EPOCH.
func (o *options) validate() error {
	if !slices.Contains(arches, o.Arch) {
		return fmt.Errorf("-arch %q is not one of %s", o.Arch, strings.Join(arches, ", "))
	}
	if o.Jobs < 1 {
		return fmt.Errorf("-j %d: at least one binary must be built at a time", o.Jobs)
	}
	if o.Root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		if o.Root, err = findRoot(wd); err != nil {
			return err
		}
	} else if _, err := os.Stat(filepath.Join(o.Root, "go.work")); err != nil {
		return fmt.Errorf("-root %s is not the repository root: %v", o.Root, err)
	}
	if o.Out == "" {
		o.Out = filepath.Join(o.Root, "bin", "images")
	}
	for _, p := range []*string{&o.Out, &o.Tar} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return err
			}
			*p = abs
		}
	}
	if o.Version == "" || o.Repo == "" {
		repo, tag, err := manifestImages(o.Root)
		if err != nil {
			return err
		}
		o.Version, o.Repo = cmp.Or(o.Version, tag), cmp.Or(o.Repo, repo)
	}
	if !tagRE.MatchString(o.Version) {
		return fmt.Errorf("-version %q cannot be an image tag: use at most 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'", o.Version)
	}
	if o.Revision == "" {
		o.Revision = git(o.Root, "rev-parse", "HEAD")
	}
	if o.Source == "" {
		o.Source = sourceURL(git(o.Root, "remote", "get-url", "origin"))
	}
	for _, t := range targets {
		if _, err := name.NewTag(imageRef(*o, t)); err != nil {
			return fmt.Errorf("-repo %q: %s is not an image name: %v", o.Repo, imageRef(*o, t), err)
		}
	}
	o.Epoch = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil || sec < 0 {
			return fmt.Errorf("SOURCE_DATE_EPOCH=%q is not a count of seconds since 1970", s)
		}
		o.Epoch = time.Unix(sec, 0).UTC()
	}
	return nil
}

// findRoot walks up from dir to the directory holding go.work.
func findRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.work in %s or above it: run images inside the repository or pass -root", dir)
		}
	}
}

// git runs git in dir and returns its trimmed output, "" on any failure.
func git(dir string, args ...string) string {
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// sourceURL turns a git remote into a browsable URL: git@host:owner/repo.git
// becomes https://host/owner/repo; credentials in an https remote are dropped.
func sourceURL(remote string) string {
	remote = strings.TrimSuffix(remote, ".git")
	if rest, ok := strings.CutPrefix(remote, "git@"); ok {
		host, path, ok := strings.Cut(rest, ":")
		if !ok {
			return ""
		}
		return "https://" + host + "/" + path
	}
	if rest, ok := strings.CutPrefix(remote, "https://"); ok {
		if at := strings.LastIndex(rest, "@"); at >= 0 && at < strings.Index(rest+"/", "/") {
			rest = rest[at+1:]
		}
		return "https://" + rest
	}
	return ""
}

// componentFile is where the manifests name the images: the kustomize
// component that every cell's services and migration Job take their images
// from, relative to the repository root.
const componentFile = "deploy/k8s/components/images/kustomization.yaml"

// manifestImages reads the repository prefix and the tag the manifests pull
// the images at: componentFile's images list, one entry per target, each
// renaming assay/<binary> to <repo>/<binary> at the one tag. Anything else
// there is an error, so the defaults never silently part from the
// manifests.
func manifestImages(root string) (repo, tag string, err error) {
	path := filepath.Join(root, componentFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("the images' names and tag: %w", err)
	}
	entries, err := componentImages(string(b))
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", path, err)
	}
	for _, t := range targets {
		e, ok := entries["assay/"+t.Name]
		switch {
		case !ok:
			return "", "", fmt.Errorf("%s: no entry for the image assay/%s", path, t.Name)
		case !strings.HasSuffix(e.newName, "/"+t.Name):
			return "", "", fmt.Errorf("%s: assay/%s is renamed %q, not <repo>/%s", path, t.Name, e.newName, t.Name)
		}
		r := strings.TrimSuffix(e.newName, "/"+t.Name)
		if (repo != "" && r != repo) || (tag != "" && e.newTag != tag) {
			return "", "", fmt.Errorf("%s: the images differ in repository or tag (%s/%s:%s beside %s:%s); give them one", path, r, t.Name, e.newTag, repo, tag)
		}
		repo, tag = r, e.newTag
	}
	if len(entries) != len(targets) {
		return "", "", fmt.Errorf("%s: %d image entries, want one per binary (%d)", path, len(entries), len(targets))
	}
	return repo, tag, nil
}

type componentImage struct{ newName, newTag string }

// componentImages reads the images list of a kustomization: entries of
// name, newName and newTag, each on its own line. A key it does not know
// is an error.
func componentImages(text string) (map[string]componentImage, error) {
	out := map[string]componentImage{}
	var cur string
	in := false
	for n, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "-") {
			in = trimmed == "images:"
			continue
		}
		if !in {
			continue
		}
		item := strings.HasPrefix(trimmed, "- ")
		k, v, ok := strings.Cut(strings.TrimPrefix(trimmed, "- "), ":")
		k, v = strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"'`)
		switch {
		case !ok || v == "":
			return nil, fmt.Errorf("line %d: %q is not a key and a value", n+1, trimmed)
		case item && k == "name":
			if _, dup := out[v]; dup {
				return nil, fmt.Errorf("line %d: %s is listed twice", n+1, v)
			}
			cur = v
			out[cur] = componentImage{}
		case item || cur == "":
			return nil, fmt.Errorf("line %d: an images entry starts with its name", n+1)
		case k == "newName":
			e := out[cur]
			e.newName = v
			out[cur] = e
		case k == "newTag":
			e := out[cur]
			e.newTag = v
			out[cur] = e
		default:
			return nil, fmt.Errorf("line %d: %q is not newName or newTag", n+1, k)
		}
	}
	for name, e := range out {
		if e.newName == "" || e.newTag == "" {
			return nil, fmt.Errorf("%s: want both newName and newTag", name)
		}
	}
	return out, nil
}

func imageRef(o options, t target) string {
	return fmt.Sprintf("%s/%s:%s", o.Repo, t.Name, o.Version)
}

// checkOut refuses an output directory that holds something other than an
// OCI image layout, since writing replaces it.
func checkOut(out string) error {
	ents, err := os.ReadDir(out)
	switch {
	case errors.Is(err, os.ErrNotExist) || err == nil && len(ents) == 0:
		return nil
	case err != nil:
		return fmt.Errorf("-out %s: %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(out, "oci-layout")); err != nil {
		return fmt.Errorf("-out %s holds files but no oci-layout; it is not an image layout this command wrote, so it is left alone (remove it or choose another -out)", out)
	}
	return nil
}

// buildBinaries builds every target statically for linux/o.Arch into dir, at
// most o.Jobs at once, reporting each on stderr, and returns each binary's
// path by name.
func buildBinaries(ctx context.Context, o options, dir string, stderr io.Writer) (map[string]string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex
		bins = map[string]string{}
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, o.Jobs)
	)
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if ctx.Err() != nil {
				return
			}
			out := filepath.Join(dir, t.Name)
			cmd := exec.CommandContext(ctx, o.Go, "build", "-trimpath",
				"-ldflags", "-X "+versionVar+"="+o.Version, "-o", out, t.Pkg)
			cmd.Dir = filepath.Join(o.Root, t.Module)
			cmd.Env = append(os.Environ(), "GOWORK=off", "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch)
			start := time.Now()
			msg, err := cmd.CombinedOutput()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if ctx.Err() == nil {
					errs = append(errs, fmt.Errorf("building %s (%s in %s): %v\n%s", t.Name, t.Pkg, t.Module, err, msg))
				}
				cancel()
				return
			}
			bins[t.Name] = out
			fmt.Fprintf(stderr, "  %s: %s\n", t.Name, time.Since(start).Round(100*time.Millisecond))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return bins, nil
}

// built is one image and its name.
type built struct {
	Target target
	Ref    string
	Image  v1.Image
}

// buildImages puts each binary on the base layer, o.Jobs at once
// (compressing a binary's layer takes a core for a second or two).
func buildImages(o options, base v1.Layer, bins map[string]string) ([]built, error) {
	imgs := make([]built, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	sem := make(chan struct{}, o.Jobs)
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			img, err := buildImage(o, t, base, bins[t.Name])
			if err != nil {
				errs[i] = fmt.Errorf("image %s: %w", t.Name, err)
				return
			}
			imgs[i] = built{Target: t, Ref: imageRef(o, t), Image: img}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return imgs, nil
}

// file is one tar entry of a layer.
type file struct {
	Name     string // absolute path in the image
	Mode     int64  // permission bits, with 01000 for sticky
	Dir      bool
	UID, GID int
	Data     []byte
}

// baseLayer is the layer every image shares: CA bundle, users and groups,
// the user's home and /tmp.
func baseLayer(o options) (v1.Layer, error) {
	ca, err := os.ReadFile(o.CABundle)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no CA bundle at %s to copy into the images (install ca-certificates, or pass -ca with another PEM bundle): %v", o.CABundle, err)
		}
		return nil, fmt.Errorf("reading the CA bundle %s: %v", o.CABundle, err)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("the CA bundle %s holds no PEM certificate", o.CABundle)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:%s:/sbin/nologin\n", userName, uid, gid, userName, homeDir)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", userName, gid)
	return layer(o.Epoch, []file{
		{Name: "/etc", Mode: 0o755, Dir: true},
		{Name: "/etc/group", Mode: 0o644, Data: []byte(group)},
		{Name: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Name: "/etc/passwd", Mode: 0o644, Data: []byte(passwd)},
		{Name: "/etc/ssl", Mode: 0o755, Dir: true},
		{Name: "/etc/ssl/certs", Mode: 0o755, Dir: true},
		{Name: caPath, Mode: 0o644, Data: ca},
		{Name: "/home", Mode: 0o755, Dir: true},
		{Name: homeDir, Mode: 0o700, Dir: true, UID: uid, GID: gid},
		{Name: "/root", Mode: 0o700, Dir: true},
		{Name: "/tmp", Mode: 0o1777, Dir: true},
	})
}

// binaryLayer holds the binary at /usr/local/bin/<name>.
func binaryLayer(o options, t target, bin string) (v1.Layer, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return layer(o.Epoch, []file{
		{Name: "/usr", Mode: 0o755, Dir: true},
		{Name: "/usr/local", Mode: 0o755, Dir: true},
		{Name: binDir, Mode: 0o755, Dir: true},
		{Name: binDir + "/" + t.Name, Mode: 0o755, Data: data},
	})
}

// layer writes files as a gzipped tar, sorted by name, every entry with the
// time at, and no other varying field, so the same files give the same digest.
func layer(at time.Time, files []file) (v1.Layer, error) {
	files = slices.Clone(files)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		h := &tar.Header{
			Name:     strings.TrimPrefix(f.Name, "/"),
			Mode:     f.Mode,
			Uid:      f.UID,
			Gid:      f.GID,
			Uname:    "root",
			Gname:    "root",
			ModTime:  at,
			Typeflag: tar.TypeReg,
			Size:     int64(len(f.Data)),
			Format:   tar.FormatPAX,
		}
		if f.UID == uid {
			h.Uname = userName
		}
		if f.GID == gid {
			h.Gname = userName
		}
		if f.Dir {
			h.Name += "/"
			h.Typeflag = tar.TypeDir
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	gz := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// buildImage assembles t's image from the empty image: base layer, binary
// layer, then the config.
func buildImage(o options, t target, base v1.Layer, bin string) (v1.Image, error) {
	top, err := binaryLayer(o, t, bin)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: o.Epoch}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "assay images: CA certificates, /etc/passwd, /etc/group, " + homeDir + ", /tmp"}},
		mutate.Addendum{Layer: top, MediaType: types.OCILayer, History: v1.History{
			Created: created, CreatedBy: "assay images: " + binDir + "/" + t.Name}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.OS = "linux"
	cf.Architecture = o.Arch
	labels := map[string]string{
		"org.opencontainers.image.title":       t.Name,
		"org.opencontainers.image.description": t.Doc,
		"org.opencontainers.image.version":     o.Version,
	}
	if o.Revision != "" {
		labels["org.opencontainers.image.revision"] = o.Revision
	}
	if o.Source != "" {
		labels["org.opencontainers.image.source"] = o.Source
	}
	cf.Config = v1.Config{
		Entrypoint: []string{binDir + "/" + t.Name},
		User:       fmt.Sprintf("%d:%d", uid, gid),
		WorkingDir: homeDir,
		Env:        []string{"PATH=" + imagePath, "SSL_CERT_FILE=" + caPath},
		Labels:     labels,
	}
	if t.Port != 0 {
		// The binary's default addresses are loopback, which nothing outside
		// a container reaches; the image listens on its ports, the API's and
		// the metrics', on every interface.
		cf.Config.Env = append(cf.Config.Env, fmt.Sprintf("ASSAY_HTTP_ADDR=:%d", t.Port), fmt.Sprintf("ASSAY_METRICS_ADDR=:%d", t.MetricsPort))
		cf.Config.ExposedPorts = map[string]struct{}{fmt.Sprintf("%d/tcp", t.Port): {}, fmt.Sprintf("%d/tcp", t.MetricsPort): {}}
	}
	return mutate.ConfigFile(img, cf)
}

// writeLayout writes the images as an OCI image layout at out, replacing
// what was there only once the new layout is complete.
func writeLayout(out string, imgs []built) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the image layout: %v", err)
	}
	for _, im := range imgs {
		cf, err := im.Image.ConfigFile()
		if err != nil {
			return err
		}
		if err := p.AppendImage(im.Image,
			layout.WithAnnotations(map[string]string{refNameAnno: im.Ref}),
			layout.WithPlatform(v1.Platform{OS: cf.OS, Architecture: cf.Architecture})); err != nil {
			return fmt.Errorf("writing %s to the image layout: %v", im.Ref, err)
		}
	}
	// MkdirTemp made the directory 0700; the layout is for others to read.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return fmt.Errorf("replacing %s: %v", out, err)
	}
	return os.Rename(tmp, out)
}

// writeTar writes every image, tagged with its ref, as one tarball docker
// load reads.
func writeTar(path string, imgs []built) error {
	refs := map[name.Reference]v1.Image{}
	for _, im := range imgs {
		tag, err := name.NewTag(im.Ref)
		if err != nil {
			return err
		}
		refs[tag] = im.Image
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %v", path, err)
	}
	return os.Rename(tmp, path)
}

// imageSize is what the image occupies in a registry: manifest, config and
// compressed layers.
func imageSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}
