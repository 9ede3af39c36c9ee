package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress draws a progress bar on a terminal for long reads; it draws
// nothing when its writer is not a terminal (piped, redirected, a test).
// A nil progress draws nothing too.
type progress struct {
	w           io.Writer
	name        string
	total, done uint64
	drawn       time.Time
}

// newProgress draws on stderr when stderr is a terminal.
func newProgress() *progress {
	fi, err := os.Stderr.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return &progress{w: os.Stderr}
}

func (p *progress) start(name string, total uint64) {
	if p == nil {
		return
	}
	p.name, p.total, p.done, p.drawn = name, total, 0, time.Time{}
	p.draw()
}

func (p *progress) step() {
	if p == nil {
		return
	}
	p.done++
	// Redraw at most ten times a second.
	if time.Since(p.drawn) >= 100*time.Millisecond || p.done == p.total {
		p.draw()
	}
}

func (p *progress) finish() {
	if p == nil {
		return
	}
	p.draw()
	fmt.Fprintln(p.w)
}

func (p *progress) draw() {
	p.drawn = time.Now()
	const width = 30
	filled := width
	if p.total > 0 {
		filled = int(min(p.done, p.total) * width / p.total)
	}
	fmt.Fprintf(p.w, "\r%s [%s%s] %d/%d", p.name, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), p.done, p.total)
}
