package chart

import (
	"image"
	"image/color"
	"math"
	"testing"
)

func TestAxesPoint(t *testing.T) {
	a := Axes{Plot: image.Rect(100, 50, 500, 250), XMax: 10, YMax: 4}
	for _, c := range []struct {
		x, y float64
		want image.Point
	}{
		{0, 0, image.Pt(100, 250)},
		{10, 4, image.Pt(500, 50)},
		{5, 2, image.Pt(300, 150)},
	} {
		if got := a.Point(c.x, c.y); got != c.want {
			t.Errorf("Point(%v, %v) = %v, want %v", c.x, c.y, got, c.want)
		}
	}
	if got := (Axes{Plot: image.Rect(0, 0, 10, 10)}).Point(3, 3); got != image.Pt(0, 10) {
		t.Errorf("zero axes: Point = %v, want the origin", got)
	}
}

// TestDraw: the frame, tick labels, titles and legend put ink where they
// should and nowhere near the plot's inside.
func TestDraw(t *testing.T) {
	img := New(600, 320)
	a := Axes{Plot: image.Rect(80, 40, 560, 260), XMax: 60, YMax: 100, XTicks: 6, YTicks: 4,
		XLabel: func(v float64) string { return "x" }, YLabel: func(v float64) string { return "yyy" },
		XTitle: "time", YTitle: "retries"}
	a.Draw(img)
	ink := func(r image.Rectangle) int {
		n := 0
		for y := r.Min.Y; y < r.Max.Y; y++ {
			for x := r.Min.X; x < r.Max.X; x++ {
				if img.RGBAAt(x, y) != White && img.RGBAAt(x, y) != Light {
					n++
				}
			}
		}
		return n
	}
	if img.RGBAAt(79, 100) != Black || img.RGBAAt(560, 100) != Black || img.RGBAAt(300, 39) != Black || img.RGBAAt(300, 260) != Black {
		t.Error("no frame around the plot")
	}
	if n := ink(image.Rect(81, 41, 559, 259)); n != 0 {
		t.Errorf("%d pixels of ink inside an empty plot", n)
	}
	if ink(image.Rect(0, 30, 78, 270)) == 0 {
		t.Error("no y tick labels")
	}
	if ink(image.Rect(60, 262, 580, 320)) == 0 {
		t.Error("no x tick labels or title")
	}
	if ink(image.Rect(80, 20, 300, 36)) == 0 {
		t.Error("no y title")
	}
	end := Legend(img, 10, 300, []LegendItem{{color.RGBA{255, 0, 0, 255}, "none"}, {Black, "full"}})
	if end <= 10+2*16 || img.RGBAAt(15, 295) != (color.RGBA{255, 0, 0, 255}) {
		t.Errorf("legend ended at %d; swatch %v", end, img.RGBAAt(15, 295))
	}
	if TextWidth("ab…") != 5*CharWidth {
		t.Errorf("TextWidth(ab…) = %d", TextWidth("ab…"))
	}
}

func TestNice(t *testing.T) {
	for _, c := range []struct {
		max   float64
		ticks int
		want  float64
		steps int
	}{
		{63.01, 6, 70, 7},
		{63.01, 4, 80, 4}, // 7 steps of 10 are more than 4+2

		{200, 4, 200, 4},
		{9, 4, 10, 5},
		{0.37, 4, 0.4, 4},
		{1, 1, 1, 2},
		{0, 4, 0, 4},
	} {
		got, steps := Nice(c.max, c.ticks)
		if math.Abs(got-c.want) > 1e-9 || steps != c.steps {
			t.Errorf("Nice(%v, %d) = %v, %d; want %v, %d", c.max, c.ticks, got, steps, c.want, c.steps)
		}
	}
}
