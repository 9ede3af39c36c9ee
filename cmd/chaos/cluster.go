package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/config"
)

// The cluster mode (-cluster) runs each cell as production does
// (deploy/k8s): a three-node JetStream cluster whose servers carry the
// cell's region tag, the cell's streams R3 and placed by it; Postgres as a
// primary and a synchronous standby (a commit waits for the standby, as
// the CloudNativePG cluster's "any 1, required" does), built with
// pg_basebackup; and two processes of every service, each reaching every
// NATS node and both Postgres hosts through a link of its own
// (link.go), with a multi-host database URL and
// target_session_attrs=read-write.

// instances is how many processes of each service a cell runs in the
// cluster mode.
const instances = 2

// natsNode is one nats-server of a cell's cluster.
type natsNode struct {
	name                   string // "nats-us-1"
	region                 string
	client, route, monitor int
	store, conf            string
	proc                   *proc
	routesTo               []string // the link addresses its routes dial
}

// pgNode is one Postgres server of a cell: a primary or its standby.
type pgNode struct {
	name string // "pg_us_a", also its application_name as a standby
	port int
	dir  string // owned by the server's user; data/ inside
	proc *proc
}

func (n *pgNode) data() string { return filepath.Join(n.dir, "data") }

// cellCluster is one cell's NATS cluster and Postgres pair.
type cellCluster struct {
	region  string
	nats    []*natsNode
	pg      [2]*pgNode
	primary int // index into pg
	db      string
}

// clusterRun is what the cluster mode adds to a harness.
type clusterRun struct {
	links  *links
	cells  map[string]*cellCluster
	pgBin  string
	pgCred *syscall.Credential
}

// setUpCluster starts every cell's Postgres pair and NATS cluster.
func (h *Harness) setUpCluster(ctx context.Context) error {
	cr := &clusterRun{links: newLinks(h.o.Seed), cells: map[string]*cellCluster{}}
	h.cl = cr
	var err error
	if cr.pgBin, err = pgBinDir(); err != nil {
		return err
	}
	if cr.pgCred, err = pgCredential(); err != nil {
		return err
	}
	// The servers run as the Postgres user, which must reach their
	// directories under the run's.
	if err := os.Chmod(h.dir, 0o755); err != nil {
		return err
	}
	for _, region := range config.DefaultRegions {
		c := &cellCluster{region: region}
		cr.cells[region] = c
		if err := h.startPGPair(ctx, c); err != nil {
			return fmt.Errorf("postgres of cell %s: %w", region, err)
		}
		if err := h.startNATSCluster(ctx, c); err != nil {
			return fmt.Errorf("nats of cell %s: %w", region, err)
		}
		h.logf("cell %s: %s primary, %s its synchronous standby; %s", region, c.pg[0].name, c.pg[1].name, strings.Join(c.natsNames(), ", "))
	}
	return nil
}

// natsClusterURL is the client URLs of a cell's nodes, direct (the
// harness's own connections are never faulted).
func (c *cellCluster) natsClusterURL() string {
	var urls []string
	for _, n := range c.nats {
		urls = append(urls, "nats://"+addr(n.client))
	}
	return strings.Join(urls, ",")
}

func (h *Harness) startNATSCluster(ctx context.Context, c *cellCluster) error {
	for i := range 3 {
		n := &natsNode{name: fmt.Sprintf("nats-%s-%d", c.region, i+1), region: c.region}
		for _, p := range []*int{&n.client, &n.route, &n.monitor} {
			var err error
			if *p, err = freePort(); err != nil {
				return err
			}
		}
		n.store = filepath.Join(h.dir, n.name)
		n.conf = filepath.Join(h.dir, n.name+".conf")
		c.nats = append(c.nats, n)
	}
	for _, n := range c.nats {
		for _, peer := range c.nats {
			if peer == n {
				continue
			}
			a, err := h.cl.links.add(n.name, peer.name, addr(peer.route))
			if err != nil {
				return err
			}
			n.routesTo = append(n.routesTo, "nats-route://"+a)
		}
		if err := os.WriteFile(n.conf, []byte(natsConf(n)), 0o644); err != nil {
			return err
		}
		n.proc = &proc{name: n.name, bin: h.bins["nats-server"], args: []string{"-c", n.conf},
			env: os.Environ(), logPath: filepath.Join(h.dir, n.name+".log"),
			ready: "http://" + addr(n.monitor) + "/healthz"}
		if err := n.proc.start(); err != nil {
			return err
		}
	}
	for _, n := range c.nats {
		if err := n.proc.waitReady(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// natsConf is one node's configuration. Its routes go through the links;
// it advertises no route and no client URL of its own, so neither its
// peers nor the clients learn a way around a link.
func natsConf(n *natsNode) string {
	q := func(s string) string { return strconv.Quote(s) }
	routes := make([]string, len(n.routesTo))
	for i, r := range n.routesTo {
		routes[i] = q(r)
	}
	return fmt.Sprintf(`server_name: %s
host: "127.0.0.1"
port: %d
http: "127.0.0.1:%d"
server_tags: [%s]
jetstream {
  store_dir: %s
  max_memory_store: 256MB
  max_file_store: 8GB
}
cluster {
  name: %s
  host: "127.0.0.1"
  port: %d
  no_advertise: true
  advertise: "127.0.0.1:1"
  routes: [%s]
}
`, q(n.name), n.client, n.monitor, q("region:"+n.region), q(n.store), q("assay-"+n.region), n.route, strings.Join(routes, ", "))
}

// pgConf is what a cell's Postgres servers run with. fsync is off: every
// fault here is a crash of a process, which the page cache outlives; what
// a commit waits for is the standby, as in production.
func pgConf(c *cellCluster, n *pgNode) string {
	return fmt.Sprintf(`
# chaos -cluster: a primary and a synchronous standby
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = ''
max_connections = 200
shared_buffers = 64MB
fsync = off
synchronous_commit = on
full_page_writes = on
wal_level = replica
wal_log_hints = on
max_wal_senders = 8
wal_keep_size = 2GB
hot_standby = on
wal_receiver_status_interval = 1s
synchronous_standby_names = 'ANY 1 (%s, %s)'
`, n.port, c.pg[0].name, c.pg[1].name)
}

// startPGPair initialises the primary, starts it, builds the standby from
// it with pg_basebackup and starts that, and waits until the primary's
// commits wait for it.
func (h *Harness) startPGPair(ctx context.Context, c *cellCluster) error {
	for i, s := range []string{"a", "b"} {
		n := &pgNode{name: "pg_" + c.region + "_" + s, dir: filepath.Join(h.dir, "pg-"+c.region+"-"+s)}
		var err error
		if n.port, err = freePort(); err != nil {
			return err
		}
		if err := os.MkdirAll(n.dir, 0o700); err != nil {
			return err
		}
		if err := os.Chown(n.dir, int(h.cl.pgCred.Uid), int(h.cl.pgCred.Gid)); err != nil {
			return err
		}
		c.pg[i] = n
	}
	a, b := c.pg[0], c.pg[1]
	if out, err := h.pgRun(ctx, a.dir, "initdb", "-D", a.data(), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := appendFile(filepath.Join(a.data(), "postgresql.conf"), pgConf(c, a)); err != nil {
		return err
	}
	if err := h.startPG(ctx, a); err != nil {
		return err
	}
	if err := h.buildStandby(ctx, c, b, a); err != nil {
		return err
	}
	if err := h.startPG(ctx, b); err != nil {
		return err
	}
	if err := h.waitStandby(ctx, c, b, 60*time.Second); err != nil {
		return err
	}
	c.db = "assay_chaos_" + c.region
	conn, err := pgx.Connect(ctx, pgURL("postgres", a.port))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{c.db}.Sanitize()); err != nil {
		return err
	}
	db, err := pgx.Connect(ctx, pgURL(c.db, a.port))
	if err != nil {
		return err
	}
	defer db.Close(context.Background())
	return createProbe(ctx, db)
}

// buildStandby makes n a standby of primary: a base backup, the standby
// signal and its primary_conninfo through the link n → primary, with n's
// name as its application_name (what synchronous_standby_names counts).
func (h *Harness) buildStandby(ctx context.Context, c *cellCluster, n, primary *pgNode) error {
	_ = os.RemoveAll(n.data())
	if out, err := h.pgRun(ctx, n.dir, "pg_basebackup", "-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres", primary.port),
		"-D", n.data(), "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		return fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	if err := appendFile(filepath.Join(n.data(), "postgresql.conf"), pgConf(c, n)); err != nil {
		return err
	}
	return h.standbyOf(n, primary)
}

// standbyOf writes what makes n start as primary's standby.
func (h *Harness) standbyOf(n, primary *pgNode) error {
	via, err := h.cl.links.add(n.name, primary.name, addr(primary.port))
	if err != nil {
		return err
	}
	host, port, _ := strings.Cut(via, ":")
	conf := fmt.Sprintf("\nprimary_conninfo = 'host=%s port=%s user=postgres application_name=%s'\n", host, port, n.name)
	if err := appendFile(filepath.Join(n.data(), "postgresql.auto.conf"), conf); err != nil {
		return err
	}
	f := filepath.Join(n.data(), "standby.signal")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		return err
	}
	return os.Chown(f, int(h.cl.pgCred.Uid), int(h.cl.pgCred.Gid))
}

// startPG starts n's postmaster as a child of the harness (so a SIGKILL
// of it is a crash of the server, and the harness's death ends it) and
// waits until it answers.
func (h *Harness) startPG(ctx context.Context, n *pgNode) error {
	if n.proc == nil {
		n.proc = &proc{name: n.name, bin: filepath.Join(h.cl.pgBin, "postgres"), args: []string{"-D", n.data()},
			env: pgEnv(), logPath: filepath.Join(h.dir, n.name+".log"), cred: h.cl.pgCred, dir: n.dir}
	}
	if err := n.proc.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, pgURL("postgres", n.port))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		if !n.proc.running() {
			return fmt.Errorf("%s exited before it answered (see %s)", n.name, n.proc.logPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering within 60s: %w (see %s)", n.name, err, n.proc.logPath)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitStandby waits until the cell's primary counts standby as the
// standby its commits wait for.
func (h *Harness) waitStandby(ctx context.Context, c *cellCluster, standby *pgNode, within time.Duration) error {
	primary := c.pg[c.primary]
	deadline := time.Now().Add(within)
	for {
		var state string
		err := func() error {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			conn, err := pgx.Connect(cctx, pgURL("postgres", primary.port))
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			return conn.QueryRow(cctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`,
				standby.name).Scan(&state)
		}()
		if err == nil && (state == "quorum" || state == "sync") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not a synchronous standby of %s within %s (state %q, %v)", standby.name, primary.name, within, state, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pgRun runs one of the server's tools as the server's user.
func (h *Harness) pgRun(ctx context.Context, dir, tool string, args ...string) ([]byte, error) {
	cmd := execAs(ctx, filepath.Join(h.cl.pgBin, tool), args, h.cl.pgCred, dir)
	return cmd.CombinedOutput()
}

// serviceDBURL is the database URL of one service process: both hosts,
// each through the process's own link, the primary chosen by
// target_session_attrs.
func (h *Harness) serviceDBURL(c *cellCluster, name string) (string, error) {
	var hosts []string
	for _, n := range c.pg {
		a, err := h.cl.links.add(name, n.name, addr(n.port))
		if err != nil {
			return "", err
		}
		hosts = append(hosts, a)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + c.db +
		"?sslmode=disable&target_session_attrs=read-write&application_name=chaos-" + name, nil
}

// serviceNATSURL is the NATS URL of one service process: every node of
// its cell through the process's own links.
func (h *Harness) serviceNATSURL(c *cellCluster, name string) (string, error) {
	var urls []string
	for _, n := range c.nats {
		a, err := h.cl.links.add(name, n.name, addr(n.client))
		if err != nil {
			return "", err
		}
		urls = append(urls, "nats://"+a)
	}
	return strings.Join(urls, ","), nil
}

// harnessDBURL is the harness's own URL for a cell: both hosts direct.
func (c *cellCluster) harnessDBURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		c.pg[0].port, c.pg[1].port, c.db)
}

func pgURL(db string, port int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", port, db)
}

// clusterPools opens the harness's pool on each cell.
func (h *Harness) clusterPools(ctx context.Context) error {
	for _, region := range config.DefaultRegions {
		c := h.cl.cells[region]
		h.dbName[region] = c.db
		h.dbURL[region] = c.harnessDBURL()
		cfg, err := pgxpool.ParseConfig(withParam(h.dbURL[region], "application_name", "chaos-harness"))
		if err != nil {
			return err
		}
		cfg.MaxConns = 4
		if h.pool[region], err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return err
		}
	}
	return nil
}

// tearDownCluster stops every server of the cells and every link.
func (h *Harness) tearDownCluster() {
	if h.cl == nil {
		return
	}
	for _, c := range h.cl.cells {
		for _, n := range c.nats {
			if n.proc != nil {
				_ = n.proc.kill()
			}
		}
		for _, n := range c.pg {
			if n != nil && n.proc != nil {
				_ = n.proc.kill()
			}
		}
	}
	h.cl.links.closeAll()
}

// healthy reports whether a URL answers 200.
func healthy(ctx context.Context, u string) bool {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, u, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	return errors.Join(err, f.Close())
}

// pgBinDir finds the PostgreSQL server's tools, the newest under
// /usr/lib/postgresql first.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		ok := true
		for _, t := range []string{"initdb", "postgres", "pg_ctl", "pg_basebackup", "pg_rewind"} {
			if _, err := os.Stat(filepath.Join(dirs[i], t)); err != nil {
				ok = false
			}
		}
		if ok {
			return dirs[i], nil
		}
	}
	return "", errors.New("-cluster needs the PostgreSQL server's tools (initdb, postgres, pg_ctl, pg_basebackup, pg_rewind) under /usr/lib/postgresql/*/bin: apt-get install postgresql")
}

// pgCredential is the user the servers run as: the postgres user when the
// harness runs as root (the server refuses root), else the harness's own.
func pgCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("-cluster as root needs a postgres user to run the servers as: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// pgEnv is the environment of the servers and their tools: none of the
// harness's PG* settings, and a HOME the server's user may read.
func pgEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	return append(env, "HOME=/")
}
