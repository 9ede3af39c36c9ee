package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// proc is one supervised OS process: a service or nats-server. Its output
// goes to a log file that survives restarts, so a run can be diagnosed.
type proc struct {
	name    string
	bin     string
	args    []string
	env     []string
	logPath string
	// ready, when set, is polled after start until it answers 200.
	ready string
	// cred, when set, is the user it runs as; dir its working directory.
	cred *syscall.Credential
	dir  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
	kills  int
}

// start launches the process. It dies with the harness (Pdeathsig), so a
// killed harness leaves nothing behind.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: already running", p.name)
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "\n=== chaos: start #%d at %s\n", p.starts+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = p.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.name, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	p.starts++
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		f.Close()
		p.mu.Lock()
		if p.cmd == cmd {
			p.cmd = nil
		}
		p.mu.Unlock()
		close(done)
	}(cmd, p.exited)
	return nil
}

// waitReady polls the ready URL until it answers 200 or d passes.
func (p *proc) waitReady(ctx context.Context, d time.Duration) error {
	if p.ready == "" {
		return nil
	}
	deadline := time.Now().Add(d)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.ready, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !p.running() {
			return fmt.Errorf("%s exited before it was ready (see %s)", p.name, p.logPath)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s (see %s)", p.name, d, p.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// signal sends sig and, for SIGKILL, waits until the process is gone.
func (p *proc) signal(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	if sig == syscall.SIGKILL && cmd != nil {
		p.kills++
	}
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: signal %v: %w", p.name, sig, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(wait):
		if sig == syscall.SIGKILL {
			return fmt.Errorf("%s: still running %s after SIGKILL", p.name, wait)
		}
		return p.signal(syscall.SIGKILL, 10*time.Second)
	}
}

// pause (SIGSTOP) and resume (SIGCONT) freeze a process: it holds its
// connections and takes nothing.
func (p *proc) pause() error  { return p.send(syscall.SIGSTOP) }
func (p *proc) resume() error { return p.send(syscall.SIGCONT) }

func (p *proc) send(sig syscall.Signal) error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	return cmd.Process.Signal(sig)
}

// kill is SIGKILL: no drain, no flush, whatever was in flight is torn.
func (p *proc) kill() error { return p.signal(syscall.SIGKILL, 10*time.Second) }

// stop is SIGTERM with time to drain, then SIGKILL.
func (p *proc) stop() error { return p.signal(syscall.SIGTERM, 30*time.Second) }

// execAs is a command run as cred (nil: the harness's own user) in dir,
// with the servers' environment, that dies with the harness.
func execAs(ctx context.Context, bin string, args []string, cred *syscall.Credential, dir string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = pgEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// given are the ports freePort has handed out in this process.
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePort asks the kernel for a free TCP port on loopback that this
// process has not handed out before. The port is reused across restarts
// of the process it is given to. The kernel may offer a port again once
// its probe listener is closed, and two servers told the same port would
// leave one of them unable to start, so a port offered twice is refused
// and another asked for.
func freePort() (int, error) {
	given.Lock()
	defer given.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !given.ports[port] {
			given.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no loopback port that was not handed out before")
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }
