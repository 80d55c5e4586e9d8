package main

import (
	"bufio"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/idem-go/idem/retry"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newBackoffCmd) }

// Limits that keep a simulation in memory and on screen.
const (
	maxSimClients  = 1_000_000
	maxSimAttempts = 64
	maxSimBuckets  = 10_000_000
)

func newBackoffCmd(a *app) *cobra.Command {
	var cfg backoffSim
	var pngPath string
	var seed int64
	var rows int
	c := &cobra.Command{
		Use:   "backoff",
		Short: "Simulate a retry storm with and without jitter",
		Long: `backoff simulates N clients that fail together at t=0 and keep failing, each
retrying --attempts times with exponential backoff (base·2^attempt, capped), for
three strategies: no jitter, equal jitter and full jitter. It prints a histogram
of retries over time and the peak retry rate of each, and the ratio of the peak
without jitter to the peak with full jitter.

The peak is measured in buckets of --bucket (default base/100): without jitter
every client retries in the same instant, so the finer the bucket, the sharper
that spike looks next to the jittered schedules.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if seed < 0 {
				seed = rand.Int64N(1 << 31)
			}
			cfg.Seed = uint64(seed)
			if err := cfg.validate(); err != nil {
				return usageErrorf("%v", err)
			}
			if rows < 1 || rows > 1000 {
				return usageErrorf("--rows must be between 1 and 1000, got %d", rows)
			}
			res := cfg.runAll()
			if err := renderBackoff(cmd.OutOrStdout(), cfg, res, rows); err != nil {
				return err
			}
			if pngPath != "" {
				if err := writeBackoffPNG(pngPath, res); err != nil {
					return fmt.Errorf("writing %s: %w", pngPath, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "chart written to %s (top to bottom: none=red, equal=orange, full=green)\n", pngPath)
			}
			return nil
		},
	}
	f := c.Flags()
	f.IntVar(&cfg.Clients, "clients", 100, "clients failing together at t=0")
	f.IntVar(&cfg.Attempts, "attempts", 6, "retries per client")
	f.DurationVar(&cfg.Base, "base", time.Second, "backoff base")
	f.DurationVar(&cfg.Cap, "cap", time.Minute, "backoff cap")
	f.DurationVar(&cfg.Bucket, "bucket", 0, "width of the buckets the retry rate is measured in (default base/100)")
	f.IntVar(&rows, "rows", 24, "rows of the ASCII histogram")
	f.StringVar(&pngPath, "png", "", "also write a PNG chart to this file")
	f.Int64Var(&seed, "seed", -1, "random seed (default: a random one, printed so the run can be repeated)")
	return c
}

// backoffSim is one retry-storm simulation.
type backoffSim struct {
	Clients  int
	Attempts int
	Base     time.Duration
	Cap      time.Duration
	Bucket   time.Duration
	Seed     uint64
}

func (s *backoffSim) validate() error {
	switch {
	case s.Clients < 1 || s.Clients > maxSimClients:
		return fmt.Errorf("--clients must be between 1 and %d, got %d", maxSimClients, s.Clients)
	case s.Attempts < 1 || s.Attempts > maxSimAttempts:
		return fmt.Errorf("--attempts must be between 1 and %d, got %d", maxSimAttempts, s.Attempts)
	case s.Base <= 0 || s.Cap < s.Base:
		return fmt.Errorf("--base must be positive and --cap at least --base, got %v and %v", s.Base, s.Cap)
	case s.Bucket < 0:
		return fmt.Errorf("--bucket must be positive, got %v", s.Bucket)
	}
	if s.Bucket == 0 {
		s.Bucket = max(s.Base/100, time.Microsecond)
	}
	// The last retry happens no later than the sum of the ceilings.
	var span time.Duration
	p := &retry.Policy{Base: s.Base, Cap: s.Cap}
	for a := range s.Attempts {
		span += p.Ceiling(a)
	}
	if n := span/s.Bucket + 1; n > maxSimBuckets {
		return fmt.Errorf("--bucket %v is too fine for a %v storm: %d buckets, the limit is %d", s.Bucket, span, n, maxSimBuckets)
	}
	return nil
}

// stormResult is the simulated retry load of one strategy.
type stormResult struct {
	Jitter retry.Jitter
	Bucket time.Duration
	// Counts[i] is the number of retries in [i·Bucket, (i+1)·Bucket).
	Counts []int
	Peak   int
	PeakAt time.Duration
	Total  int
}

// PeakRate is the peak number of retries per second.
func (r stormResult) PeakRate() float64 { return float64(r.Peak) / r.Bucket.Seconds() }

// strategies are simulated in this order; the report compares the first and last.
var strategies = []retry.Jitter{retry.NoJitter, retry.EqualJitter, retry.FullJitter}

func (s *backoffSim) runAll() []stormResult {
	out := make([]stormResult, len(strategies))
	for i, j := range strategies {
		out[i] = s.run(j)
	}
	return out
}

// run simulates every client for one strategy: client c retries at the
// running sum of its delays.
func (s *backoffSim) run(j retry.Jitter) stormResult {
	p := &retry.Policy{Base: s.Base, Cap: s.Cap, Jitter: j, Rand: rand.New(rand.NewPCG(s.Seed, uint64(j)))}
	r := stormResult{Jitter: j, Bucket: s.Bucket}
	for range s.Clients {
		var t time.Duration
		for a := range s.Attempts {
			t += p.Delay(a)
			i := int(t / s.Bucket)
			for len(r.Counts) <= i {
				r.Counts = append(r.Counts, 0)
			}
			r.Counts[i]++
			r.Total++
		}
	}
	for i, n := range r.Counts {
		if n > r.Peak {
			r.Peak, r.PeakAt = n, time.Duration(i)*s.Bucket
		}
	}
	return r
}

// peakRatio is the no-jitter peak over the full-jitter peak.
func peakRatio(res []stormResult) float64 {
	none, full := res[0], res[len(res)-1]
	if full.Peak == 0 {
		return 0
	}
	return float64(none.Peak) / float64(full.Peak)
}

// renderBackoff prints one histogram per strategy on a common time axis of
// rows rows. A row's bar is the busiest bucket inside it, so the bar is the
// peak load a server sees in that period; the count is all retries in it.
func renderBackoff(w io.Writer, s backoffSim, res []stormResult, rows int) error {
	bw := bufio.NewWriter(w)
	span := 0
	for _, r := range res {
		span = max(span, len(r.Counts))
	}
	perRow := (span + rows - 1) / rows
	maxPeak := 0
	for _, r := range res {
		maxPeak = max(maxPeak, r.Peak)
	}
	const width = 50
	fmt.Fprintf(bw, "%d clients fail at t=0 and retry %d times; base %v, cap %v, seed %d\n", s.Clients, s.Attempts, s.Base, s.Cap, s.Seed)
	fmt.Fprintf(bw, "bar: busiest %v bucket in the row (# = %.2g retries); count: all retries in the row\n",
		s.Bucket, float64(maxPeak)/width)
	for _, r := range res {
		fmt.Fprintf(bw, "\n%s jitter: peak %d retries in %v at t=%v (%.0f retries/s), %d retries in all\n",
			r.Jitter, r.Peak, s.Bucket, r.PeakAt.Round(time.Millisecond), r.PeakRate(), r.Total)
		for row := 0; row*perRow < span; row++ {
			lo, hi := row*perRow, min((row+1)*perRow, len(r.Counts))
			busiest, count := 0, 0
			for i := lo; i < hi; i++ {
				busiest, count = max(busiest, r.Counts[i]), count+r.Counts[i]
			}
			bar := 0
			if busiest > 0 {
				bar = max(1, busiest*width/maxPeak)
			}
			fmt.Fprintf(bw, "%9s %-*s %5d\n", (time.Duration(lo) * s.Bucket).Round(time.Millisecond), width, strings.Repeat("#", bar), count)
		}
	}
	fmt.Fprintf(bw, "\npeak retry rate: none %.0f/s, equal %.0f/s, full %.0f/s\n", res[0].PeakRate(), res[1].PeakRate(), res[2].PeakRate())
	fmt.Fprintf(bw, "ratio no jitter / full jitter: %.1fx\n", peakRatio(res))
	return bw.Flush()
}

// writeBackoffPNG draws one panel per strategy (top to bottom: none in
// red, equal in orange, full in green) on common axes, one vertical line per
// pixel column up to its busiest bucket. Only the standard library is used,
// so the chart has no text: the colours and the order are the legend.
func writeBackoffPNG(path string, res []stormResult) error {
	const w, panelH, pad = 800, 160, 10
	h := len(res)*(panelH+pad) + pad
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fill(img, img.Bounds(), color.RGBA{255, 255, 255, 255})
	colours := []color.RGBA{{200, 30, 30, 255}, {230, 140, 0, 255}, {30, 150, 60, 255}}
	span, maxPeak := 1, 1
	for _, r := range res {
		span, maxPeak = max(span, len(r.Counts)), max(maxPeak, r.Peak)
	}
	plotW := w - 2*pad
	for k, r := range res {
		top := pad + k*(panelH+pad)
		frame := image.Rect(pad-1, top-1, pad+plotW+1, top+panelH+1)
		fill(img, frame, color.RGBA{120, 120, 120, 255})
		fill(img, frame.Inset(1), color.RGBA{250, 250, 250, 255})
		for x := range plotW {
			lo, hi := x*span/plotW, (x+1)*span/plotW
			busiest := 0
			for i := lo; i < hi && i < len(r.Counts); i++ {
				busiest = max(busiest, r.Counts[i])
			}
			if busiest == 0 {
				continue
			}
			bar := max(1, busiest*(panelH-2)/maxPeak)
			fill(img, image.Rect(pad+x, top+panelH-1-bar, pad+x+1, top+panelH-1), colours[k%len(colours)])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func fill(img *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			img.SetRGBA(x, y, c)
		}
	}
}
