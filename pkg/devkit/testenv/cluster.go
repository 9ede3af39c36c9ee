package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is a JetStream cluster of embedded servers on 127.0.0.1, each
// with its own store under the test's temporary directory. Its nodes can be
// stopped and started again on the same ports and store, so a test can take
// a stream's leader away and bring it back.
type Cluster struct {
	Name  string
	mu    sync.Mutex
	nodes []*clusterNode
}

type clusterNode struct {
	opts *server.Options
	srv  *server.Server // nil while stopped
}

// clusterAccount is the account the cluster's clients use: the global one,
// since the cluster configures no accounts.
const clusterAccount = server.DEFAULT_GLOBAL_ACCOUNT

// NewCluster starts an n-node JetStream cluster whose servers all carry
// tags (e.g. "region:us", for placement), waits until it has elected a meta
// leader and answers JetStream requests, and shuts it down when tb ends.
// Fewer than 3 nodes cannot hold an R3 stream; n must be at least 2.
func NewCluster(tb testing.TB, n int, tags ...string) *Cluster {
	tb.Helper()
	if n < 2 {
		tb.Fatalf("testenv: a cluster needs at least 2 nodes, not %d", n)
	}
	var c *Cluster
	var err error
	// The route ports are chosen before the servers bind them; another
	// process may take one in between, so a failed start is tried again.
	for try := 1; try <= 3; try++ {
		if c, err = startCluster(tb.TempDir(), n, tags); err == nil {
			break
		}
	}
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(c.shutdown)
	if err := c.WaitReady(30 * time.Second); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return c
}

// NewFormingCluster is an n-node cluster of which only the first up nodes
// run: a cluster still forming, or with nodes away, as a service may meet
// it at its start. It does not wait for a meta leader. Every node's client
// port is chosen at once, so URL names the nodes not started yet, and
// Start starts one (n2, n3, …) when the test wants it to join.
func NewFormingCluster(tb testing.TB, n, up int, tags ...string) *Cluster {
	tb.Helper()
	if n < 2 || up < 1 || up > n {
		tb.Fatalf("testenv: a forming cluster of %d nodes with %d up", n, up)
	}
	var c *Cluster
	var err error
	for try := 1; try <= 3; try++ {
		if c, err = newCluster(tb.TempDir(), n, tags, true); err == nil {
			if err = c.startNodes(up); err == nil {
				break
			}
		}
	}
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(c.shutdown)
	return c
}

func startCluster(dir string, n int, tags []string) (*Cluster, error) {
	c, err := newCluster(dir, n, tags, false)
	if err != nil {
		return nil, err
	}
	return c, c.startNodes(n)
}

// startNodes starts the first up nodes.
func (c *Cluster) startNodes(up int) error {
	for _, nd := range c.nodes[:up] {
		if err := nd.start(); err != nil {
			c.shutdown()
			return err
		}
		// Clients find the node on the same port after a restart.
		nd.opts.Port = nd.srv.Addr().(*net.TCPAddr).Port
	}
	return nil
}

// newCluster configures an n-node cluster without starting it; with
// clientPorts, each node's client port is chosen now rather than at its
// start.
func newCluster(dir string, n int, tags []string, clientPorts bool) (*Cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []string
	for _, p := range ports[:n] {
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(p))
	}
	client := func(i int) int {
		if clientPorts {
			return ports[n+i]
		}
		return -1
	}
	// A name of its own: a route port another test takes up cannot join
	// two tests' clusters into one.
	c := &Cluster{Name: "assay-test-" + strconv.Itoa(ports[0])}
	for i := range n {
		name := "n" + strconv.Itoa(i+1)
		c.nodes = append(c.nodes, &clusterNode{opts: &server.Options{
			ServerName: name,
			Host:       "127.0.0.1",
			Port:       client(i),
			JetStream:  true,
			StoreDir:   dir + "/" + name,
			Tags:       append([]string(nil), tags...),
			NoSigs:     true,
			NoLog:      true,
			Cluster: server.ClusterOpts{
				Name: c.Name,
				Host: "127.0.0.1",
				Port: ports[i],
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		}})
	}
	return c, nil
}

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment
// ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// start starts the node on its ports. A port chosen before the node binds
// it (a forming cluster's, or a stopped node's) may have been taken by
// another process in between; the node then moves to a free one and tries
// again. Its peers still find it: it dials their routes itself, and
// clients learn its new address from the cluster.
func (nd *clusterNode) start() error {
	var err error
	for try := 1; try <= 3; try++ {
		// A taken port is seen before the start, which would otherwise wait
		// its whole deadline for a listener that never comes.
		moved, merr := nd.moveTakenPorts()
		if merr != nil {
			return errors.Join(err, merr)
		}
		if try > 1 && !moved {
			return err
		}
		if err = nd.startOnce(); err == nil {
			return nil
		}
	}
	return err
}

func (nd *clusterNode) startOnce() error {
	opts := *nd.opts
	s, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("cluster node %s: %w", nd.opts.ServerName, err)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		return fmt.Errorf("cluster node %s (client port %d, route port %d) not ready for connections within 30s",
			nd.opts.ServerName, nd.opts.Port, nd.opts.Cluster.Port)
	}
	nd.srv = s
	return nil
}

// moveTakenPorts gives the node a free port in place of each of its ports
// that another process holds, and says whether it moved any.
func (nd *clusterNode) moveTakenPorts() (bool, error) {
	moved := false
	for _, port := range []*int{&nd.opts.Port, &nd.opts.Cluster.Port} {
		if *port <= 0 || portFree(*port) {
			continue
		}
		free, err := freePorts(1)
		if err != nil {
			return moved, err
		}
		if port == &nd.opts.Cluster.Port {
			nd.opts.Routes = withoutPort(nd.opts.Routes, *port)
		}
		*port, moved = free[0], true
	}
	return moved, nil
}

// portFree says whether a listener can bind port on 127.0.0.1 now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// withoutPort is routes less the one to port, which another process now
// holds: the node must not dial it as a peer.
func withoutPort(routes []*url.URL, port int) []*url.URL {
	var kept []*url.URL
	for _, r := range routes {
		if r.Port() != strconv.Itoa(port) {
			kept = append(kept, r)
		}
	}
	return kept
}

func (nd *clusterNode) stop() {
	if nd.srv != nil {
		nd.srv.Shutdown()
		nd.srv.WaitForShutdown()
		nd.srv = nil
	}
}

func (c *Cluster) shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nd := range c.nodes {
		nd.stop()
	}
}

// URL is the client URL of every node, comma separated, as nats.Connect
// takes it: a client reconnects to another node when its own goes away.
func (c *Cluster) URL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, "nats://127.0.0.1:"+strconv.Itoa(nd.opts.Port))
	}
	return strings.Join(urls, ",")
}

// Names are the nodes' server names, n1 to nN.
func (c *Cluster) Names() []string {
	var names []string
	for _, nd := range c.nodes {
		names = append(names, nd.opts.ServerName)
	}
	return names
}

// Servers are the running nodes.
func (c *Cluster) Servers() []*server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ss []*server.Server
	for _, nd := range c.nodes {
		if nd.srv != nil {
			ss = append(ss, nd.srv)
		}
	}
	return ss
}

// Server is the running node named name, nil when it is stopped or unknown.
func (c *Cluster) Server(name string) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nd := c.node(name); nd != nil {
		return nd.srv
	}
	return nil
}

func (c *Cluster) node(name string) *clusterNode {
	for _, nd := range c.nodes {
		if nd.opts.ServerName == name {
			return nd
		}
	}
	return nil
}

// WaitReady waits until every running node is current with an elected meta
// leader and a client of the cluster gets its JetStream account info.
func (c *Cluster) WaitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	var last error
	for {
		if last = c.ready(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster %s not ready within %s: %w", c.Name, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) ready() error {
	leader := ""
	for _, s := range c.Servers() {
		if !s.JetStreamIsCurrent() {
			return fmt.Errorf("node %s is not current with the meta group", s.Name())
		}
		if s.JetStreamIsLeader() {
			leader = s.Name()
		}
	}
	if leader == "" {
		return errors.New("no meta leader")
	}
	nc, err := nats.Connect(c.URL(), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// StreamLeader is the name of the running node that leads stream (in the
// global account), "" while it has no leader.
func (c *Cluster) StreamLeader(stream string) string {
	for _, s := range c.Servers() {
		if s.JetStreamIsStreamLeader(clusterAccount, stream) {
			return s.Name()
		}
	}
	return ""
}

// WaitStreamLeader waits until stream has a leader other than not (which
// may be "") and returns its name.
func (c *Cluster) WaitStreamLeader(stream, not string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		if l := c.StreamLeader(stream); l != "" && l != not {
			return l, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("stream %s has no leader other than %q after %s", stream, not, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StopStreamLeader shuts down the node that leads stream and returns its
// name; it fails tb when the stream has no leader.
func (c *Cluster) StopStreamLeader(tb testing.TB, stream string) string {
	tb.Helper()
	name, err := c.WaitStreamLeader(stream, "", 10*time.Second)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	c.Stop(tb, name)
	return name
}

// Stop shuts node name down; its store stays for Start.
func (c *Cluster) Stop(tb testing.TB, name string) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.node(name)
	if nd == nil {
		tb.Fatalf("testenv: cluster %s has no node %s", c.Name, name)
	}
	nd.stop()
}

// Start starts node name again, stopped before, on its ports and store.
func (c *Cluster) Start(tb testing.TB, name string) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	nd := c.node(name)
	if nd == nil {
		tb.Fatalf("testenv: cluster %s has no node %s", c.Name, name)
	}
	if nd.srv != nil {
		tb.Fatalf("testenv: node %s is running", name)
	}
	if err := nd.start(); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
}

// WaitStreamCurrent waits until stream has a leader and every running node
// is current with it: it says so, and its own store holds what the
// leader's does.
func (c *Cluster) WaitStreamCurrent(stream string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		err := c.streamCurrent(stream)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stream %s after %s: %w", stream, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) streamCurrent(stream string) error {
	leader := c.StreamLeader(stream)
	if leader == "" {
		return errors.New("no leader")
	}
	want, err := c.NodeStreamState(leader, stream)
	if err != nil {
		return err
	}
	for _, s := range c.Servers() {
		if !s.JetStreamIsStreamCurrent(clusterAccount, stream) {
			return fmt.Errorf("node %s is not current with leader %s", s.Name(), leader)
		}
		got, err := c.NodeStreamState(s.Name(), stream)
		if err != nil {
			return err
		}
		if got.Msgs != want.Msgs || got.LastSeq != want.LastSeq {
			return fmt.Errorf("node %s holds %d messages to sequence %d, leader %s %d to %d",
				s.Name(), got.Msgs, got.LastSeq, leader, want.Msgs, want.LastSeq)
		}
	}
	return nil
}

// NodeStreamState is the state of stream in node name's own store (in the
// global account), whether or not the node leads it.
func (c *Cluster) NodeStreamState(name, stream string) (server.StreamState, error) {
	s := c.Server(name)
	if s == nil {
		return server.StreamState{}, fmt.Errorf("node %s is not running", name)
	}
	jsz, err := s.Jsz(&server.JSzOptions{Account: clusterAccount, Streams: true})
	if err != nil {
		return server.StreamState{}, fmt.Errorf("node %s: %w", name, err)
	}
	for _, acc := range jsz.AccountDetails {
		for _, sd := range acc.Streams {
			if sd.Name == stream {
				return sd.State, nil
			}
		}
	}
	return server.StreamState{}, fmt.Errorf("node %s holds no stream %s", name, stream)
}

// ConsumerLeader is the name of the running node that leads the durable
// consumer of stream (in the global account), "" while it has none.
func (c *Cluster) ConsumerLeader(stream, consumer string) string {
	for _, s := range c.Servers() {
		if s.JetStreamIsConsumerLeader(clusterAccount, stream, consumer) {
			return s.Name()
		}
	}
	return ""
}

// MoveConsumerLeader makes node to the leader of the durable consumer of
// stream, by asking its leader to step down until the election picks to.
func (c *Cluster) MoveConsumerLeader(stream, consumer, to string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		l := c.ConsumerLeader(stream, consumer)
		if l == to {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer %s on %s: leader %q, not %s, after %s", consumer, stream, l, to, within)
		}
		if s := c.Server(l); s != nil {
			if err := s.JetStreamStepdownConsumer(clusterAccount, stream, consumer); err != nil {
				return fmt.Errorf("consumer %s on %s: step down on %s: %w", consumer, stream, l, err)
			}
			// Wait for the election before asking again.
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if n := c.ConsumerLeader(stream, consumer); n != "" && n != l {
					break
				}
			}
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
}
