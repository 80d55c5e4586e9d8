// Package chart draws the project's PNG charts (the benchmark report's bar
// charts, "idem backoff --png") with one look: text in a fixed 7×13 font,
// framed plots with labelled ticks, a title and a legend. It is shared by
// modules of this repository and has no compatibility promise.
package chart

import (
	"image"
	"image/color"
	"image/draw"
	"math"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Glyph sizes of the font: every character is CharWidth wide; a line of
// text is LineHeight high, its baseline Ascent below its top.
const (
	CharWidth  = 7
	LineHeight = 13
	Ascent     = 11
)

// Colours used across charts.
var (
	Black = color.RGBA{0x00, 0x00, 0x00, 0xff}
	Grey  = color.RGBA{0x9e, 0x9e, 0x9e, 0xff}
	Light = color.RGBA{0xee, 0xee, 0xee, 0xff}
	White = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

// asciiOnly maps the typography of reports onto what the font can draw.
var asciiOnly = strings.NewReplacer("…", "...", "×", "x", "–", "-", "—", "-", "µ", "u", "→", "->")

// New returns a white canvas of w×h pixels.
func New(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.NewUniform(White), image.Point{}, draw.Src)
	return img
}

// Text draws s with its baseline at (x, y).
func Text(img draw.Image, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(asciiOnly.Replace(s))
}

// TextWidth is the width of s in pixels.
func TextWidth(s string) int { return CharWidth * len([]rune(asciiOnly.Replace(s))) }

// Fill paints r.
func Fill(img draw.Image, r image.Rectangle, c color.Color) {
	draw.Draw(img, r, image.NewUniform(c), image.Point{}, draw.Src)
}

// LegendItem is one colour of a legend and what it stands for.
type LegendItem struct {
	Color color.Color
	Label string
}

// Legend draws items in a row from (x, y), the baseline of their labels,
// each a swatch and its label, and returns the x where it ended.
func Legend(img draw.Image, x, y int, items []LegendItem) int {
	for _, it := range items {
		Fill(img, image.Rect(x, y-10, x+12, y), it.Color)
		Text(img, x+16, y, it.Label, Black)
		x += 16 + TextWidth(it.Label) + 18
	}
	return x
}

// Axes is a plot area with a frame, labelled ticks on both axes and axis
// titles. Values run from 0 to XMax and 0 to YMax.
type Axes struct {
	// Plot is the area inside the frame, in pixels. Tick labels are drawn
	// left of it and below it: leave room (about 8 characters left, two
	// lines below).
	Plot       image.Rectangle
	XMax, YMax float64
	// XTicks and YTicks are how many intervals the ticks divide each axis
	// into (at least 1).
	XTicks, YTicks int
	// XLabel and YLabel format a tick's value.
	XLabel, YLabel func(v float64) string
	// XTitle is written under the x tick labels, YTitle above the plot's
	// top-left corner.
	XTitle, YTitle string
}

// Point is the pixel of the value (x, y).
func (a Axes) Point(x, y float64) image.Point {
	px, py := a.Plot.Min.X, a.Plot.Max.Y
	if a.XMax > 0 {
		px += int(x / a.XMax * float64(a.Plot.Dx()))
	}
	if a.YMax > 0 {
		py -= int(y / a.YMax * float64(a.Plot.Dy()))
	}
	return image.Pt(px, py)
}

// Draw draws the frame, the grid lines of the y ticks, the ticks and their
// labels, and the titles. Draw it before the data, so the data is on top.
func (a Axes) Draw(img draw.Image) {
	p := a.Plot
	Fill(img, image.Rect(p.Min.X-1, p.Min.Y-1, p.Max.X+1, p.Max.Y+1), Black)
	Fill(img, p, White)
	yt, xt := max(a.YTicks, 1), max(a.XTicks, 1)
	for i := 0; i <= yt; i++ {
		v := a.YMax * float64(i) / float64(yt)
		y := a.Point(0, v).Y
		if i > 0 && i < yt {
			Fill(img, image.Rect(p.Min.X, y, p.Max.X, y+1), Light)
		}
		Fill(img, image.Rect(p.Min.X-5, y, p.Min.X-1, y+1), Black)
		if a.YLabel != nil {
			l := a.YLabel(v)
			Text(img, p.Min.X-8-TextWidth(l), y+4, l, Black)
		}
	}
	for i := 0; i <= xt; i++ {
		v := a.XMax * float64(i) / float64(xt)
		x := a.Point(v, 0).X
		Fill(img, image.Rect(x, p.Max.Y+1, x+1, p.Max.Y+5), Black)
		if a.XLabel != nil {
			l := a.XLabel(v)
			lx := x - TextWidth(l)/2
			lx = min(max(lx, p.Min.X-TextWidth(l)/2), p.Max.X-TextWidth(l)/2)
			Text(img, lx, p.Max.Y+5+Ascent+2, l, Black)
		}
	}
	if a.XTitle != "" {
		Text(img, p.Min.X+(p.Dx()-TextWidth(a.XTitle))/2, p.Max.Y+5+2*LineHeight+4, a.XTitle, Black)
	}
	if a.YTitle != "" {
		Text(img, p.Min.X, p.Min.Y-5, a.YTitle, Black)
	}
}

// Nice rounds an axis up for ticks a reader can add in their head: it
// returns a maximum of at least max that is a whole number of steps, each
// step 1, 2 or 5 times a power of ten, the smallest such step that makes
// at most ticks+2 steps.
func Nice(max float64, ticks int) (niceMax float64, steps int) {
	ticks = max0(ticks)
	if max <= 0 {
		return max, ticks
	}
	p := math.Pow(10, math.Floor(math.Log10(max/float64(ticks+2))))
	for {
		for _, m := range []float64{1, 2, 5} {
			step := m * p
			if steps = int(math.Ceil(max/step - 1e-9)); steps <= ticks+2 {
				return float64(steps) * step, steps
			}
		}
		p *= 10
	}
}

func max0(n int) int { return max(n, 1) }
