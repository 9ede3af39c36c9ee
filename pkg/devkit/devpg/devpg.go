// Package devpg runs a throwaway PostgreSQL cluster from the machine's own
// server binaries, for dev mode and for tests when no server answers.
package devpg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// dirPrefix names the temp dirs Start creates, so that clusters leaked by a
// killed process can be found and stopped by the next Start.
const dirPrefix = "assay-devpg-"

// Cluster is one running postgres with its data under a single directory.
type Cluster struct {
	dir     string
	data    string
	bin     string
	port    int
	cred    *syscall.Credential
	removeD bool // Start created dir, so Stop removes all of it

	stopOnce sync.Once
	stopErr  error
}

// Start initialises a cluster in dir ("" = a new temp dir) and starts it on
// a free port on 127.0.0.1 with trust auth for user postgres.
func Start(ctx context.Context, dir string) (*Cluster, error) {
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}

	c := &Cluster{bin: bin, cred: cred}
	if dir == "" {
		reapLeaked(ctx, bin, cred)
		if dir, err = os.MkdirTemp("", dirPrefix+"*"); err != nil {
			return nil, fmt.Errorf("devpg: %w", err)
		}
		c.removeD = true
	} else {
		if dir, err = filepath.Abs(dir); err != nil {
			return nil, fmt.Errorf("devpg: %w", err)
		}
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			c.removeD = true
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("devpg: %w", err)
		}
	}
	c.dir = dir
	c.data = filepath.Join(dir, "data")

	if err := c.start(ctx); err != nil {
		c.cleanup()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	// The socket path must fit in sun_path (108 bytes).
	if n := len(filepath.Join(c.dir, ".s.PGSQL.65535")); n > 107 {
		return fmt.Errorf("devpg: directory %s is too long for a unix socket path (%d > 107 bytes)", c.dir, n)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("devpg: %w", err)
	}
	if c.cred != nil {
		if err := chownAll(c.dir, c.cred); err != nil {
			return err
		}
		if err := traversable(filepath.Dir(c.dir), c.cred); err != nil {
			return err
		}
	}

	out, err := c.run(ctx, "initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	if err != nil {
		return fmt.Errorf("devpg: initdb in %s failed: %w\n%s", c.data, err, tail(out))
	}
	conf := fmt.Sprintf("\n# devpg: throwaway cluster, durability off\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 32MB\nmax_connections = 200\n",
		strings.ReplaceAll(c.dir, "'", "''"))
	if err := appendConf(c.data, conf); err != nil {
		return err
	}

	// The free port is only free until someone else takes it, so a lost
	// race gets a few fresh ports.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return err
		}
		if err := appendConf(c.data, fmt.Sprintf("port = %d\n", port)); err != nil {
			return err
		}
		logFile := filepath.Join(c.dir, "postgres.log")
		out, err := c.run(ctx, "pg_ctl", "start", "-w", "-t", "60", "-D", c.data, "-l", logFile)
		if err == nil {
			c.port = port
			return nil
		}
		log, _ := os.ReadFile(logFile)
		lastErr = fmt.Errorf("devpg: pg_ctl start on port %d failed: %w\n%s%s", port, err, tail(out), tail(log))
		// A start cut short by ctx may have left a postmaster behind.
		_, _ = c.run(context.Background(), "pg_ctl", "stop", "-m", "immediate", "-w", "-D", c.data)
		if ctx.Err() != nil || !bytes.Contains(log, []byte("could not bind")) && !bytes.Contains(log, []byte("in use")) {
			break
		}
	}
	return lastErr
}

// URL is the connection URL of database db on this cluster.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(db))
}

// Port is the TCP port the cluster listens on.
func (c *Cluster) Port() int { return c.port }

// Stop shuts the server down (fast mode) and removes its files. Later calls
// return the first call's result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := c.run(ctx, "pg_ctl", "stop", "-m", "fast", "-w", "-D", c.data)
		if err != nil {
			c.stopErr = fmt.Errorf("devpg: pg_ctl stop failed: %w\n%s", err, tail(out))
		}
		c.stopErr = errors.Join(c.stopErr, c.cleanup())
	})
	return c.stopErr
}

func (c *Cluster) cleanup() error {
	target := c.data
	if c.removeD {
		target = c.dir
	}
	if err := os.RemoveAll(target); err != nil {
		return fmt.Errorf("devpg: %w", err)
	}
	if !c.removeD {
		os.Remove(filepath.Join(c.dir, "postgres.log"))
		os.Remove(filepath.Join(c.dir, "owner.pid"))
	}
	return nil
}

// run executes one of the server binaries, as the unprivileged user when
// this process is root, because initdb, pg_ctl and postgres refuse root.
func (c *Cluster) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return runAs(ctx, c.bin, c.cred, c.dir, name, args...)
}

func runAs(ctx context.Context, bin string, cred *syscall.Credential, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	cmd.Dir = dir
	cmd.Env = env(cred)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	// pg_ctl's postmaster keeps the output pipe open, so waiting for the
	// pipe to close would hang; a bound WaitDelay ends that wait.
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// env drops PG* variables that would point the tools at another server or
// data directory.
func env(cred *syscall.Credential) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || cred != nil && strings.HasPrefix(kv, "HOME=") {
			continue
		}
		out = append(out, kv)
	}
	if cred != nil {
		out = append(out, "HOME=/")
	}
	return out
}

func appendConf(data, s string) error {
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("devpg: %w", err)
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("devpg: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var tools = []string{"initdb", "pg_ctl", "postgres"}

// findBin returns a directory holding initdb, pg_ctl and postgres together:
// the one pg_ctl on PATH resolves to, else the highest
// /usr/lib/postgresql/<version>/bin.
func findBin() (string, error) {
	var tried []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		d := filepath.Dir(p)
		if hasTools(d) {
			return d, nil
		}
		tried = append(tried, d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if hasTools(d) {
			return d, nil
		}
		tried = append(tried, d)
	}
	where := "PATH and /usr/lib/postgresql/*/bin"
	if len(tried) > 0 {
		where += " (looked in " + strings.Join(tried, ", ") + ")"
	}
	return "", fmt.Errorf("devpg: PostgreSQL server binaries not found: need initdb, pg_ctl and postgres together on %s; install the PostgreSQL server package (e.g. apt-get install postgresql) or set a database URL", where)
}

func hasTools(dir string) bool {
	for _, t := range tools {
		fi, err := os.Stat(filepath.Join(dir, t))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// version reads the <version> in /usr/lib/postgresql/<version>/bin as a
// number so that 15 sorts above 9.6.
func version(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

// credential returns nil unless running as root, and then the user the
// server tools run as: postgres if it exists, else nobody.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var u *user.User
	var err error
	for _, name := range []string{"postgres", "nobody"} {
		if u, err = user.Lookup(name); err == nil {
			break
		}
	}
	if u == nil {
		return nil, fmt.Errorf("devpg: running as root and neither a postgres nor a nobody user exists to run the server as (initdb and postgres refuse root): %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("devpg: user %s: %w", u.Username, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func chownAll(dir string, cred *syscall.Credential) error {
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(cred.Uid), int(cred.Gid))
	})
	if err != nil {
		return fmt.Errorf("devpg: handing %s to uid %d: %w", dir, cred.Uid, err)
	}
	return nil
}

// traversable checks that the unprivileged user can reach dir through every
// parent, which a temp dir under a private TMPDIR would not allow.
func traversable(dir string, cred *syscall.Credential) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("devpg: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		m := fi.Mode().Perm()
		okX := m&0o001 != 0 || ok && (st.Uid == cred.Uid && m&0o100 != 0 || st.Gid == cred.Gid && m&0o010 != 0)
		if !okX {
			return fmt.Errorf("devpg: uid %d cannot traverse %s (mode %v), which the server needs to reach its data; use a directory under a world-traversable path such as /tmp", cred.Uid, d, m)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// reapLeaked stops and removes clusters whose owning process is gone, as
// left behind when a test binary is killed before Stop.
func reapLeaked(ctx context.Context, bin string, cred *syscall.Credential) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		data := filepath.Join(d, "data")
		if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
			stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, _ = runAs(stopCtx, bin, cred, d, "pg_ctl", "stop", "-m", "immediate", "-w", "-D", data)
			cancel()
		}
		os.RemoveAll(d)
	}
}

// tail keeps the end of a tool's output for an error message.
func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
