package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// printer writes the demo's output: steps, a log of what happens, and
// state summaries. The informers' handlers write concurrently with the
// story, so every write holds the lock. With a terminal, steps and events
// are coloured.
type printer struct {
	mu    sync.Mutex
	out   io.Writer
	start time.Time
	color bool
}

func newPrinter(f *os.File) *printer {
	info, err := f.Stat()
	color := err == nil && info.Mode()&os.ModeCharDevice != 0 && os.Getenv("NO_COLOR") == ""
	return &printer{out: f, start: time.Now(), color: color}
}

// ANSI styles, used only on a terminal.
const (
	bold   = "\033[1m"
	dim    = "\033[2m"
	red    = "\033[31m"
	green  = "\033[32m"
	yellow = "\033[33m"
	cyan   = "\033[36m"
	reset  = "\033[0m"
)

func (p *printer) style(s, text string) string {
	if !p.color || s == "" {
		return text
	}
	return s + text + reset
}

func (p *printer) elapsed() string {
	return fmt.Sprintf("%6.1fs", time.Since(p.start).Seconds())
}

// step announces what the demo does next.
func (p *printer) step(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "\n%s %s\n", p.style(dim, p.elapsed()), p.style(bold+cyan, "==> "+fmt.Sprintf(format, args...)))
}

// line prints indented text under a step.
func (p *printer) line(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "        %s\n", fmt.Sprintf(format, args...))
}

// event logs one observed change; what is a short tag (attach, detach,
// ...) and colour picks how it stands out.
func (p *printer) event(colour, what, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "%s %s %s\n", p.style(dim, p.elapsed()), p.style(colour, fmt.Sprintf("%-14s", what)), fmt.Sprintf(format, args...))
}

// block prints a multi-line text, each line indented.
func (p *printer) block(text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		fmt.Fprintf(p.out, "        %s\n", l)
	}
}

// heading prints a section title of a summary.
func (p *printer) heading(title string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.out, "      %s\n", p.style(bold, title))
}
