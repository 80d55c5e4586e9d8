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
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/shared/chart"
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
				if err := writeBackoffPNG(pngPath, cfg, res); err != nil {
					return fmt.Errorf("writing %s: %w", pngPath, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "chart written to %s\n", pngPath)
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
// rows rows. A row's bar and its number are the same thing, the busiest
// bucket inside the row (the peak load a server sees in that period); the
// last column is every retry in the row.
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
	fmt.Fprintf(bw, "%d clients fail at t=0 and retry %d times; base %s, cap %s, seed %d\n", s.Clients, s.Attempts, fmtSpan(s.Base), fmtSpan(s.Cap), s.Seed)
	fmt.Fprintf(bw, "each row is %s; bar and PEAK: the busiest %s bucket in the row (# = %.2g retries); IN ROW: every retry in the row\n",
		fmtSpan(time.Duration(perRow)*s.Bucket), fmtSpan(s.Bucket), float64(maxPeak)/width)
	for _, r := range res {
		fmt.Fprintf(bw, "\n%s jitter: peak %d retries in %s at t=%s (%.0f retries/s), %d retries in all\n",
			r.Jitter, r.Peak, fmtSpan(s.Bucket), fmtSpan(r.PeakAt), r.PeakRate(), r.Total)
		fmt.Fprintf(bw, "%9s %-*s %5s %6s\n", "FROM", width, "", "PEAK", "IN ROW")
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
			fmt.Fprintf(bw, "%9s %-*s %5d %6d\n", fmtSpan(time.Duration(lo)*s.Bucket), width, strings.Repeat("#", bar), busiest, count)
		}
	}
	fmt.Fprintf(bw, "\npeak retry rate: none %.0f/s, equal %.0f/s, full %.0f/s\n", res[0].PeakRate(), res[1].PeakRate(), res[2].PeakRate())
	fmt.Fprintf(bw, "ratio no jitter / full jitter: %.1fx\n", peakRatio(res))
	return bw.Flush()
}

// fmtSpan prints a time on the storm's axis in one unit a reader can
// compare down a column: milliseconds under a second, seconds with at most
// three decimals above (90.5s, not 1m30.5s).
func fmtSpan(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d < time.Millisecond:
		return d.String()
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64) + "ms"
	}
	return strconv.FormatFloat(d.Round(time.Millisecond).Seconds(), 'f', -1, 64) + "s"
}

// strategyColors are the strategies' colours, in the order of strategies.
var strategyColors = []color.RGBA{{0xc6, 0x28, 0x28, 0xff}, {0xef, 0x8f, 0x00, 0xff}, {0x2e, 0x7d, 0x32, 0xff}}

// writeBackoffPNG draws one panel per strategy on common axes: time since
// the failure on x, retries per bucket on y (one vertical line per pixel
// column up to its busiest bucket), a title naming the simulation, each
// panel's strategy and peak, and a legend.
func writeBackoffPNG(path string, s backoffSim, res []stormResult) error {
	const (
		width, panelH, left, right, top, gap = 900, 170, 80, 20, 60, 62
	)
	h := top + len(res)*(panelH+gap) + 10
	img := chart.New(width, h)
	chart.Text(img, left, 20, fmt.Sprintf("Retry storm: %d clients fail at t=0 and retry %d times (base %s, cap %s, seed %d)",
		s.Clients, s.Attempts, fmtSpan(s.Base), fmtSpan(s.Cap), s.Seed), chart.Black)
	var legend []chart.LegendItem
	for k, r := range res {
		legend = append(legend, chart.LegendItem{Color: strategyColors[k%len(strategyColors)], Label: r.Jitter.String() + " jitter"})
	}
	chart.Legend(img, left, 40, legend)

	span, maxPeak := 1, 1
	for _, r := range res {
		span, maxPeak = max(span, len(r.Counts)), max(maxPeak, r.Peak)
	}
	xMax, xTicks := chart.Nice(float64(time.Duration(span)*s.Bucket), 6)
	yMax, yTicks := chart.Nice(float64(maxPeak), 4)
	for k, r := range res {
		y0 := top + k*(panelH+gap) + 20
		a := chart.Axes{
			Plot: image.Rect(left, y0, width-right, y0+panelH), XMax: xMax, YMax: yMax, XTicks: xTicks, YTicks: yTicks,
			XLabel: func(v float64) string { return fmtSpan(time.Duration(v).Round(time.Millisecond)) },
			YLabel: func(v float64) string { return strconv.Itoa(int(v + 0.5)) },
			XTitle: "time since the failure",
			YTitle: fmt.Sprintf("%s jitter: retries per %s bucket (peak %d at t=%s, %.0f/s)",
				r.Jitter, fmtSpan(s.Bucket), r.Peak, fmtSpan(r.PeakAt), r.PeakRate()),
		}
		a.Draw(img)
		plotW := a.Plot.Dx()
		c := strategyColors[k%len(strategyColors)]
		buckets := int(xMax / float64(s.Bucket)) // the axis may end after the storm
		for x := range plotW {
			lo, hi := x*buckets/plotW, (x+1)*buckets/plotW
			busiest := 0
			for i := lo; i < max(hi, lo+1) && i < len(r.Counts); i++ {
				busiest = max(busiest, r.Counts[i])
			}
			if busiest == 0 {
				continue
			}
			p := a.Point(0, float64(busiest))
			chart.Fill(img, image.Rect(a.Plot.Min.X+x, min(p.Y, a.Plot.Max.Y-1), a.Plot.Min.X+x+1, a.Plot.Max.Y), c)
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
