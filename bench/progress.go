package bench

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"
)

// progress draws one bar on a terminal line: how many runs are done out of
// all, and what runs now.
type progress struct {
	w        io.Writer
	total    int
	finished int
	start    time.Time
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, total: total, start: time.Now()}
}

const barWidth = 30

func (p *progress) step(label string) {
	if p.w == nil {
		return
	}
	// Reruns of noisy rows go beyond the total planned.
	filled := min(barWidth*p.finished/max(p.total, 1), barWidth)
	fmt.Fprintf(p.w, "\r\033[K[%s%s] %3d/%d %6s  %s", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled),
		p.finished, max(p.total, p.finished), time.Since(p.start).Round(time.Second), label)
	p.finished++
}

func (p *progress) done() {
	if p.w == nil {
		return
	}
	fmt.Fprintf(p.w, "\r\033[K[%s] %d/%d %s\n", strings.Repeat("#", barWidth), p.total, p.total, time.Since(p.start).Round(time.Second))
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
