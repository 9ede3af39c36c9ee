package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	testVersion  = "v9.8.7-test"
	testRevision = "0123456789abcdef0123456789abcdef01234567"
	testSource   = "https://example.test/assay"
)

// testDir holds what the tests build; TestMain removes it.
var testDir string

func TestMain(m *testing.M) {
	var err error
	if testDir, err = os.MkdirTemp("", "assay-images-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(testDir)
	os.Exit(code)
}

// The command is built once, without -race, and run as make images runs
// it: under the race detector, compressing five 50 MB binaries in-process
// takes minutes.
var command struct {
	once sync.Once
	path string
	err  error
}

// build runs the command into dir, with -tar, from this directory.
func build(t *testing.T, dir string) (out, tarPath string) {
	t.Helper()
	command.once.Do(func() {
		command.path = filepath.Join(testDir, "images")
		msg, err := exec.Command("go", "build", "-o", command.path, ".").CombinedOutput()
		if err != nil {
			command.err = fmt.Errorf("go build: %v\n%s", err, msg)
		}
	})
	if command.err != nil {
		t.Fatal(command.err)
	}
	out, tarPath = filepath.Join(dir, "images"), filepath.Join(dir, "images.tar")
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(command.path, "-out", out, "-tar", tarPath, "-version", testVersion, "-repo", "assay",
		"-revision", testRevision, "-source", testSource)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("images: %v\n%s%s", err, stderr.String(), stdout.String())
	}
	t.Logf("built in %s:\n%s%s", time.Since(start).Round(100*time.Millisecond), stderr.String(), stdout.String())
	return out, tarPath
}

// The first build is shared by every test that reads it.
var first struct {
	once     sync.Once
	out, tar string
	ok       bool
}

func firstBuild(t *testing.T) (out, tarPath string) {
	t.Helper()
	first.once.Do(func() {
		first.out, first.tar = build(t, filepath.Join(testDir, "first"))
		first.ok = true
	})
	if !first.ok {
		t.Fatal("the first build failed (see the test that ran it)")
	}
	return first.out, first.tar
}

// readLayout reads the layout at out back: each image by its ref name.
func readLayout(t *testing.T, out string) (map[string]v1.Image, map[string]v1.Descriptor) {
	t.Helper()
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != len(targets) {
		t.Fatalf("the layout holds %d manifests, want %d", len(im.Manifests), len(targets))
	}
	imgs, descs := map[string]v1.Image{}, map[string]v1.Descriptor{}
	for _, d := range im.Manifests {
		ref := d.Annotations[refNameAnno]
		if ref == "" {
			t.Fatalf("manifest %s has no %s annotation", d.Digest, refNameAnno)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		imgs[ref], descs[ref] = img, d
	}
	return imgs, descs
}

func TestImages(t *testing.T) {
	out, _ := firstBuild(t)
	imgs, descs := readLayout(t, out)
	hostCA, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		t.Log("entrypoints run chrooted into the unpacked image as 65532:65532")
	} else {
		t.Log("entrypoints run in place from the unpacked image (not root: no chroot)")
	}
	var baseDigests []v1.Hash
	for _, tg := range targets {
		ref := "assay/" + tg.Name + ":" + testVersion
		t.Run(tg.Name, func(t *testing.T) {
			img, ok := imgs[ref]
			if !ok {
				t.Fatalf("no image named %s in the layout", ref)
			}
			if p := descs[ref].Platform; p == nil || p.OS != "linux" || p.Architecture != runtime.GOARCH {
				t.Errorf("index platform %+v, want linux/%s", p, runtime.GOARCH)
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
				t.Errorf("manifest %s with config %s, want OCI media types", m.MediaType, m.Config.MediaType)
			}
			if len(m.Layers) != 2 {
				t.Fatalf("%d layers, want 2 (base, binary)", len(m.Layers))
			}
			for _, l := range m.Layers {
				if l.MediaType != types.OCILayer {
					t.Errorf("layer %s is %s, want %s", l.Digest, l.MediaType, types.OCILayer)
				}
			}
			baseDigests = append(baseDigests, m.Layers[0].Digest)

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cf.Config
			if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
				t.Errorf("config platform %s/%s", cf.OS, cf.Architecture)
			}
			if !cf.Created.Time.Equal(time.Unix(0, 0)) {
				t.Errorf("created %s, want the Unix epoch (SOURCE_DATE_EPOCH unset)", cf.Created.Time)
			}
			entry := "/usr/local/bin/" + tg.Name
			if !slices.Equal(c.Entrypoint, []string{entry}) || len(c.Cmd) != 0 {
				t.Errorf("entrypoint %q cmd %q, want [%s] and no cmd", c.Entrypoint, c.Cmd, entry)
			}
			if c.User != "65532:65532" {
				t.Errorf("user %q, want 65532:65532", c.User)
			}
			if c.WorkingDir != homeDir {
				t.Errorf("working dir %q, want %s", c.WorkingDir, homeDir)
			}
			for _, want := range []string{"SSL_CERT_FILE=" + caPath, "PATH=" + imagePath} {
				if !slices.Contains(c.Env, want) {
					t.Errorf("env %q lacks %s", c.Env, want)
				}
			}
			for k, want := range map[string]string{
				"org.opencontainers.image.title":    tg.Name,
				"org.opencontainers.image.version":  testVersion,
				"org.opencontainers.image.revision": testRevision,
				"org.opencontainers.image.source":   testSource,
			} {
				if got := c.Labels[k]; got != want {
					t.Errorf("label %s = %q, want %q", k, got, want)
				}
			}
			var wantPorts []string
			if tg.Port != 0 {
				wantPorts = []string{fmt.Sprintf("%d/tcp", tg.Port), fmt.Sprintf("%d/tcp", tg.MetricsPort)}
				for _, want := range []string{fmt.Sprintf("ASSAY_HTTP_ADDR=:%d", tg.Port), fmt.Sprintf("ASSAY_METRICS_ADDR=:%d", tg.MetricsPort)} {
					if !slices.Contains(c.Env, want) {
						t.Errorf("env %q lacks %s", c.Env, want)
					}
				}
			}
			var ports []string
			for p := range c.ExposedPorts {
				ports = append(ports, p)
			}
			slices.Sort(ports)
			if !slices.Equal(ports, wantPorts) {
				t.Errorf("exposed ports %q, want %q", ports, wantPorts)
			}

			root := t.TempDir()
			hdrs := unpack(t, img, root)
			for p, h := range hdrs {
				if !h.ModTime.Equal(time.Unix(0, 0)) {
					t.Errorf("%s has mtime %s, want the Unix epoch", p, h.ModTime)
				}
			}
			bin := hdrs[entry]
			switch {
			case bin == nil:
				t.Fatalf("entrypoint %s is not in the image's file system", entry)
			case bin.Typeflag != tar.TypeReg || bin.Mode != 0o755 || bin.Uid != 0 || bin.Gid != 0:
				t.Errorf("entrypoint %s: type %c mode %o owner %d:%d, want a regular file, 0755, root", entry, bin.Typeflag, bin.Mode, bin.Uid, bin.Gid)
			}
			if fi, err := os.Stat(filepath.Join(root, entry)); err != nil || fi.Mode()&0o111 == 0 {
				t.Errorf("unpacked entrypoint is not executable: %v %v", fi, err)
			}
			checkStatic(t, filepath.Join(root, entry))
			if got, err := os.ReadFile(filepath.Join(root, caPath)); err != nil || !bytes.Equal(got, hostCA) {
				t.Errorf("%s in the image is not the build machine's (%d bytes, %v)", caPath, len(got), err)
			}
			if h := hdrs["/tmp"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
				t.Errorf("/tmp: %+v, want a directory with mode 1777", h)
			}
			if h := hdrs[homeDir]; h == nil || h.Typeflag != tar.TypeDir || h.Uid != uid || h.Gid != gid {
				t.Errorf("%s: %+v, want a directory owned by %d:%d", homeDir, h, uid, gid)
			}
			passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
			if !strings.Contains(string(passwd), "\nnonroot:x:65532:65532:nonroot:/home/nonroot:") {
				t.Errorf("/etc/passwd has no user 65532:\n%s", passwd)
			}
			group, _ := os.ReadFile(filepath.Join(root, "etc/group"))
			if !strings.Contains(string(group), "\nnonroot:x:65532:") {
				t.Errorf("/etc/group has no group 65532:\n%s", group)
			}

			help, code := runEntrypoint(t, root, c, nil, "--help")
			if code != 0 {
				t.Fatalf("%s --help exited %d:\n%s", tg.Name, code, help)
			}
			if !strings.Contains(help, "ASSAY_DATABASE_URL") {
				t.Errorf("%s --help does not name ASSAY_DATABASE_URL:\n%s", tg.Name, help)
			}
			if tg.Port != 0 {
				// The port the image exposes is the one the binary defaults to.
				want := fmt.Sprintf("(default 127.0.0.1:%d)", tg.Port)
				if line := helpLine(help, "ASSAY_HTTP_ADDR"); !strings.Contains(line, want) {
					t.Errorf("%s --help says %q of ASSAY_HTTP_ADDR, want %s", tg.Name, line, want)
				}
				want = fmt.Sprintf("(default 127.0.0.1:%d)", tg.MetricsPort)
				if line := helpLine(help, "ASSAY_METRICS_ADDR"); !strings.Contains(line, want) {
					t.Errorf("%s --help says %q of ASSAY_METRICS_ADDR, want %s", tg.Name, line, want)
				}
			}
			if tg.Port != 0 {
				// With the image's settings and the few a deployment adds, the
				// service starts, listening on the exposed port, and stops only
				// because nothing answers at its database (exit 1, not 2).
				out, code := runEntrypoint(t, root, c, []string{"ASSAY_REGION=us", "ASSAY_STARTUP_WAIT=0",
					"ASSAY_DATABASE_URL=postgres://assay@127.0.0.1:1/assay",
					"ASSAY_MODEL_BASE_URL=http://127.0.0.1:1/v1", "ASSAY_MODEL=m"})
				want := fmt.Sprintf(`"http_addr":":%d"`, tg.Port)
				if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "ASSAY_DATABASE_URL") {
					t.Errorf("%s started with the image's settings exited %d, want 1 after logging %s and failing at ASSAY_DATABASE_URL:\n%s", tg.Name, code, want, out)
				}
			}
			if tg.Name == "assay" {
				// The image's assay is the operator's tool: the development
				// commands are in assay-dev, and asking for one is a usage
				// error that says where it went.
				out, code := runEntrypoint(t, root, c, nil, "dev")
				if code != 2 || !strings.Contains(out, "development commands are in assay-dev") {
					t.Errorf("the image's assay dev exited %d with %q, want 2 naming assay-dev", code, out)
				}
			}
			if tg.Name == "ingress" {
				v, code := runEntrypoint(t, root, c, nil, "--version")
				if code != 0 || !strings.HasPrefix(v, "ingress "+testVersion+" (") {
					t.Errorf("ingress --version exited %d with %q, want ingress %s (…)", code, v, testVersion)
				}
			}
		})
	}
	for _, d := range baseDigests[1:] {
		if d != baseDigests[0] {
			t.Errorf("base layers differ (%s, %s): the five images should share one", baseDigests[0], d)
		}
	}
}

// helpLine is the line of help that names v.
func helpLine(help, v string) string {
	for l := range strings.Lines(help) {
		if strings.Contains(l, v) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// unpack writes img's flattened file system under root and returns each
// entry's header by absolute path.
func unpack(t *testing.T, img v1.Image, root string) map[string]*tar.Header {
	t.Helper()
	// The root of a container's file system is 0755, not TempDir's 0700.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	hdrs := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := path.Clean("/" + h.Name)
		if p == "/" || strings.Contains(h.Name, "..") {
			t.Fatalf("unexpected entry %q", h.Name)
		}
		hdrs[p] = h
		dst := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, 0o755)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		default:
			t.Fatalf("%s: unexpected entry type %c", p, h.Typeflag)
		}
		if err == nil {
			err = os.Chmod(dst, h.FileInfo().Mode())
		}
		if err == nil && os.Geteuid() == 0 {
			err = os.Lchown(dst, h.Uid, h.Gid)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return hdrs
}

// checkStatic fails unless bin is a statically linked ELF executable for
// this machine: no interpreter, no shared libraries, so it needs nothing the
// image does not hold.
func checkStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatalf("%s is not an ELF executable: %v", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s is dynamically linked (%s)", bin, p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs shared libraries %q", bin, libs)
	}
}

// runEntrypoint runs the image's entrypoint with args and only the image's
// environment, and returns its combined output and exit code. Run as root,
// the test runs it as the container would: chrooted into the unpacked file
// system as the image's user, in its working directory; otherwise it runs
// the unpacked binary in place.
func runEntrypoint(t *testing.T, root string, c v1.Config, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.CommandContext(ctx, c.Entrypoint[0], args...)
		cmd.Dir = c.WorkingDir
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	} else {
		cmd = exec.CommandContext(ctx, filepath.Join(root, c.Entrypoint[0]), args...)
		cmd.Dir = filepath.Join(root, c.WorkingDir)
	}
	cmd.Env = append(slices.Clone(c.Env), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	case err != nil:
		t.Fatalf("running %s %q: %v", c.Entrypoint[0], args, err)
	}
	return string(out), 0
}

// TestTarball reads the docker tarball's manifest.json, which docker load
// follows: every ref, naming the config and layers of the layout's image,
// each present in the tarball; and loads one image back whole.
func TestTarball(t *testing.T) {
	out, tarPath := firstBuild(t)
	imgs, _ := readLayout(t, out)
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
	if err != nil {
		t.Fatal(err)
	}
	entries := tarEntries(t, tarPath)
	if len(m) != len(targets) {
		t.Errorf("manifest.json lists %d images, want %d", len(m), len(targets))
	}
	for _, d := range m {
		if len(d.RepoTags) != 1 {
			t.Errorf("manifest.json entry %+v: want one tag", d)
			continue
		}
		ref := d.RepoTags[0]
		img, ok := imgs[ref]
		if !ok {
			t.Errorf("the tarball's %s is not in the layout", ref)
			continue
		}
		cfg, _ := img.ConfigName()
		if d.Config != cfg.String() || entries[d.Config] == "" {
			t.Errorf("%s: the tarball's config %s (present: %t), the layout's %s", ref, d.Config, entries[d.Config] != "", cfg)
		}
		ls, _ := img.Manifest()
		var want []string
		for _, l := range ls.Layers {
			want = append(want, l.Digest.Hex+".tar.gz")
			if got := entries[l.Digest.Hex+".tar.gz"]; got != l.Digest.String() {
				t.Errorf("%s: layer %s in the tarball has digest %q", ref, l.Digest, got)
			}
		}
		if !slices.Equal(d.Layers, want) {
			t.Errorf("%s: the tarball's layers %q, the layout's %q", ref, d.Layers, want)
		}
		delete(imgs, ref)
	}
	if len(imgs) > 0 {
		t.Errorf("images missing from the tarball: %v", slices.Collect(maps.Keys(imgs)))
	}

	tag, err := name.NewTag("assay/ingress:" + testVersion)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(tarPath, &tag)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/ingress"}) || len(cf.RootFS.DiffIDs) != 2 {
		t.Errorf("ingress from the tarball: entrypoint %q, %d layers", cf.Config.Entrypoint, len(cf.RootFS.DiffIDs))
	}
}

// tarEntries is each regular file of a tarball by name, with its sha256.
func tarEntries(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries := map[string]string{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.New()
		if _, err := io.Copy(sum, tr); err != nil {
			t.Fatal(err)
		}
		entries[h.Name] = fmt.Sprintf("sha256:%x", sum.Sum(nil))
	}
}

// TestReproducible builds everything again, binaries included, and expects
// the same bytes: the same manifest digests, index and tarball.
func TestReproducible(t *testing.T) {
	out1, tar1 := firstBuild(t)
	out2, tar2 := build(t, filepath.Join(testDir, "second"))
	_, d1 := readLayout(t, out1)
	_, d2 := readLayout(t, out2)
	for ref, d := range d1 {
		if d2[ref].Digest != d.Digest {
			t.Errorf("%s: %s, then %s", ref, d.Digest, d2[ref].Digest)
		} else {
			t.Logf("%s %s both times", ref, d.Digest)
		}
	}
	b1, err1 := os.ReadFile(filepath.Join(out1, "index.json"))
	b2, err2 := os.ReadFile(filepath.Join(out2, "index.json"))
	if err1 != nil || err2 != nil || !bytes.Equal(b1, b2) {
		t.Errorf("the two index.json differ (%v, %v):\n%s\n%s", err1, err2, b1, b2)
	}
	// The tarball writer orders its entries by map iteration, so only its
	// contents are the same: every file, manifest.json included.
	if e1, e2 := tarEntries(t, tar1), tarEntries(t, tar2); !maps.Equal(e1, e2) {
		t.Errorf("the two tarballs hold different files:\n%v\n%v", e1, e2)
	}
}

// TestSourceDateEpoch: SOURCE_DATE_EPOCH dates the files and the config.
func TestSourceDateEpoch(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	o, err := parseFlags([]string{"-version", testVersion}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := time.Unix(1700000000, 0)
	if !o.Epoch.Equal(want) {
		t.Fatalf("epoch %s, want %s", o.Epoch, want)
	}
	base, err := baseLayer(o)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ledger")
	if err := os.WriteFile(bin, []byte("not a real binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := buildImage(o, targets[4], base, bin)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !cf.Created.Time.Equal(want) {
		t.Errorf("created %s, want %s", cf.Created.Time, want)
	}
	for _, h := range cf.History {
		if !h.Created.Time.Equal(want) {
			t.Errorf("history %q created %s, want %s", h.CreatedBy, h.Created.Time, want)
		}
	}
	hdrs := unpack(t, img, t.TempDir())
	if len(hdrs) == 0 {
		t.Fatal("empty file system")
	}
	for p, h := range hdrs {
		if !h.ModTime.Equal(want) {
			t.Errorf("%s has mtime %s, want %s", p, h.ModTime, want)
		}
	}

	t.Setenv("SOURCE_DATE_EPOCH", "yesterday")
	if _, err := parseFlags(nil, io.Discard); err == nil || !strings.Contains(err.Error(), `SOURCE_DATE_EPOCH="yesterday"`) {
		t.Errorf("SOURCE_DATE_EPOCH=yesterday: %v, want an error naming it", err)
	}
}

// TestFlags: -h documents the flags; a bad flag or input is named, before
// anything is built.
func TestFlags(t *testing.T) {
	var usage bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"-out", "-version", "-arch", "-tar", "-repo", "SOURCE_DATE_EPOCH", "bin/images", "docker load"} {
		if !strings.Contains(usage.String(), want) {
			t.Errorf("-h does not mention %s:\n%s", want, usage.String())
		}
	}

	notRoot := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-arch", "mips"}, `-arch "mips" is not one of amd64, arm64`},
		{[]string{"-version", "1.0+build"}, `-version "1.0+build" cannot be an image tag`},
		{[]string{"-version", "-x"}, `-version "-x" cannot be an image tag`},
		{[]string{"-repo", "Assay"}, `-repo "Assay": Assay/assay:`},
		{[]string{"-j", "0"}, "-j 0"},
		{[]string{"-root", notRoot}, notRoot + " is not the repository root"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
	} {
		_, err := parseFlags(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}

	// Inputs are checked before the binaries are built: these fail at once.
	missing := filepath.Join(t.TempDir(), "no-such-ca.crt")
	start := time.Now()
	err := run(context.Background(), []string{"-ca", missing, "-out", filepath.Join(t.TempDir(), "o")}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no CA bundle at "+missing) {
		t.Errorf("missing CA bundle: %v, want an error naming %s", err, missing)
	}
	notPEM := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"-ca", notPEM, "-out", filepath.Join(t.TempDir(), "o")}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), notPEM+" holds no PEM certificate") {
		t.Errorf("CA bundle without certificates: %v", err)
	}
	occupied := t.TempDir()
	keep := filepath.Join(occupied, "notes.txt")
	if err := os.WriteFile(keep, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"-out", occupied}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-out "+occupied+" holds files but no oci-layout") {
		t.Errorf("-out over other files: %v", err)
	}
	if _, serr := os.Stat(keep); serr != nil {
		t.Errorf("the refused -out lost its file: %v", serr)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the refusals took %s: something was built first", d)
	}
}

func TestSourceURL(t *testing.T) {
	for in, want := range map[string]string{
		"git@github.com:acme/assay.git":             "https://github.com/acme/assay",
		"https://github.com/acme/assay.git":         "https://github.com/acme/assay",
		"https://user:secret@github.com/acme/assay": "https://github.com/acme/assay",
		"https://github.com/acme/assay@v1/sub":      "https://github.com/acme/assay@v1/sub",
		"/srv/git/assay":                            "",
		"":                                          "",
	} {
		if got := sourceURL(in); got != want {
			t.Errorf("sourceURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDefaultsAreTheManifests: with no -version and no -repo the images are
// named and tagged as deploy/k8s/components/images says, whatever git
// describe would answer, so a fresh clone builds what its manifests pull.
func TestDefaultsAreTheManifests(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(o.Root, componentFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		for _, line := range []string{"newName: " + o.Repo + "/" + tg.Name + "\n", "newTag: " + o.Version + "\n"} {
			if !strings.Contains(string(b), line) {
				t.Errorf("%s: the default %s is not what %s says (no %q)", tg.Name, imageRef(o, tg), componentFile, line)
			}
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-list"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, tg := range targets {
		want = append(want, imageRef(o, tg))
	}
	if got := strings.Fields(out.String()); !slices.Equal(got, want) {
		t.Errorf("-list printed %q, want %q", got, want)
	}
	o, err = parseFlags([]string{"-version", "9.9.9", "-repo", "registry.example.org/team"}, io.Discard)
	if err != nil || imageRef(o, targets[1]) != "registry.example.org/team/ingress:9.9.9" {
		t.Errorf("flags do not win over the manifests: %v %v", imageRef(o, targets[1]), err)
	}
}

// TestComponentImages: the images list is read strictly; what it cannot
// read is an error naming the line, never a silent default.
func TestComponentImages(t *testing.T) {
	got, err := componentImages("# c\nkind: Component\nimages:\n  - name: assay/x\n    newName: r.example/assay/x\n    newTag: \"1.2\"\nother: 1\n")
	if err != nil || got["assay/x"] != (componentImage{"r.example/assay/x", "1.2"}) || len(got) != 1 {
		t.Errorf("%v %v", got, err)
	}
	for text, want := range map[string]string{
		"images:\n  - name: a\n    newTage: 1\n":                               `"newTage" is not newName or newTag`,
		"images:\n  - name: a\n    newName: r/a\n":                             "want both newName and newTag",
		"images:\n  - newName: r/a\n":                                          "starts with its name",
		"images:\n  - name: a\n    newName: r/a\n    newTag: 1\n  - name: a\n": "listed twice",
	} {
		if _, err := componentImages(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
	}
}
