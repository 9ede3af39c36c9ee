package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echoServer answers every connection by sending back what it reads.
func echoServer(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln
}

func linkTo(t *testing.T, target string) *link {
	t.Helper()
	ls := newLinks(1)
	t.Cleanup(ls.closeAll)
	if _, err := ls.add("a", "b", target); err != nil {
		t.Fatal(err)
	}
	return ls.all["a>b"]
}

// silent reports whether nothing at all — no byte, no close — arrives on
// c within d.
func silent(t *testing.T, c net.Conn, d time.Duration) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	var b [1]byte
	_, err := c.Read(b[:])
	return errors.Is(err, os.ErrDeadlineExceeded)
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %q: %v", msg, err)
	}
	if string(got) != msg {
		t.Fatalf("read back %q, want %q", got, msg)
	}
}

// TestLinkCutIsSilence: a cut link moves nothing and closes nothing; what
// was sent across it arrives once it heals, in order, and a connection
// opened across the cut reaches its target then.
func TestLinkCutIsSilence(t *testing.T) {
	t.Parallel()
	l := linkTo(t, echoServer(t).Addr().String())
	c, err := net.Dial("tcp", l.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "before")
	l.set(linkState{Cut: true})
	if _, err := c.Write([]byte("during")); err != nil {
		t.Fatal(err)
	}
	if !silent(t, c, 300*time.Millisecond) {
		t.Fatal("a byte or a close crossed a cut link")
	}
	fresh, err := net.Dial("tcp", l.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if _, err := fresh.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	if !silent(t, fresh, 300*time.Millisecond) {
		t.Fatal("a connection opened across a cut link was answered")
	}
	l.set(linkState{})
	got := make([]byte, len("during"))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "during" {
		t.Fatalf("after the heal read %q, %v; want what was sent during the cut", got, err)
	}
	got = make([]byte, 3)
	_ = fresh.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(fresh, got); err != nil || string(got) != "new" {
		t.Fatalf("the connection opened during the cut read %q, %v after the heal", got, err)
	}
	roundTrip(t, c, "after")
}

// TestLinkCutHidesAClose: the target going away while the link is cut is
// not seen until it heals; then the close comes through.
func TestLinkCutHidesAClose(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	l := linkTo(t, ln.Addr().String())
	c, err := net.Dial("tcp", l.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	server := <-accepted
	l.set(linkState{Cut: true})
	server.Close()
	if !silent(t, c, 300*time.Millisecond) {
		t.Fatal("the target's close crossed a cut link")
	}
	l.set(linkState{})
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Fatalf("after the heal: %v, want the close (EOF)", err)
	}
}

// TestLinkDelayAndLoss: a delayed link takes at least its delay each way;
// a lossy one still delivers every byte, in order.
func TestLinkDelayAndLoss(t *testing.T) {
	t.Parallel()
	l := linkTo(t, echoServer(t).Addr().String())
	c, err := net.Dial("tcp", l.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "warm")
	l.set(linkState{Delay: 100 * time.Millisecond})
	t0 := time.Now()
	roundTrip(t, c, "slow")
	if rt := time.Since(t0); rt < 200*time.Millisecond {
		t.Fatalf("round trip %s over a link delayed 100ms each way", rt)
	}
	l.set(linkState{Loss: 0.3})
	msg := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB, ~90 segments
	go func() { _, _ = c.Write(msg) }()
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("a lossy link reordered or changed bytes")
	}
}
