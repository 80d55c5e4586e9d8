package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-go/idem/shared/chart"
)

var roleColor = map[Role]color.RGBA{
	RoleCeiling:  {0x9e, 0x9e, 0x9e, 0xff},
	RoleTextbook: {0xe0, 0x8a, 0x3c, 0xff},
	RoleIdem:     {0x2e, 0x7d, 0x32, 0xff},
	RolePeer:     {0x3f, 0x6f, 0xb5, 0xff},
}

const (
	chartWidth  = 1100
	labelWidth  = 560
	rowHeight   = 20
	chartMargin = 10
)

// WriteChart draws one horizontal bar per result (median, with a min–max
// whisker), coloured by role, as a PNG. Bars share one linear scale.
func WriteChart(w io.Writer, title string, results []Result) error {
	h := chartMargin*2 + rowHeight*(len(results)+2)
	img := chart.New(chartWidth, h)
	text(img, chartMargin, chartMargin+13, title+" (msgs/s, median, whisker = min-max)", color.Black)
	top := 0.0
	for _, r := range results {
		top = max(top, r.Max())
	}
	span := float64(chartWidth - labelWidth - 2*chartMargin - 60)
	for i, r := range results {
		y := chartMargin + rowHeight*(i+1)
		s := r.Scenario
		label := fmt.Sprintf("%s c=%d d=%d%%", s.Name, s.Concurrency, s.DupPercent)
		if len(label) > 78 {
			label = label[:78]
		}
		text(img, chartMargin, y+14, label, color.Black)
		if top == 0 || r.Err != nil {
			text(img, labelWidth, y+14, "failed", color.RGBA{0xc0, 0, 0, 0xff})
			continue
		}
		x0 := labelWidth
		x1 := x0 + int(span*r.Median()/top)
		draw.Draw(img, image.Rect(x0, y+3, max(x1, x0+1), y+rowHeight-3), image.NewUniform(roleColor[s.Role]), image.Point{}, draw.Src)
		lo, hi := x0+int(span*r.Min()/top), x0+int(span*r.Max()/top)
		mid := y + rowHeight/2
		draw.Draw(img, image.Rect(lo, mid, hi+1, mid+1), image.NewUniform(color.Black), image.Point{}, draw.Src)
		text(img, hi+6, y+14, fmtRate(r.Median()), color.Black)
	}
	var legend []chart.LegendItem
	for _, role := range []Role{RoleCeiling, RoleTextbook, RoleIdem, RolePeer} {
		legend = append(legend, chart.LegendItem{Color: roleColor[role], Label: role.String()})
	}
	chart.Legend(img, chartMargin, chartMargin+rowHeight*(len(results)+1)+14, legend)
	return png.Encode(w, img)
}

// text draws s with its baseline at (x, y) in the charts' font.
func text(img draw.Image, x, y int, s string, c color.Color) { chart.Text(img, x, y, s, c) }

// WriteCharts writes one PNG per group into dir and returns, per group, the
// file's path as seen from relTo (the report's directory).
func WriteCharts(dir, relTo string, results []Result) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, g := range Groups {
		var rows []Result
		for _, r := range results {
			if r.Scenario.Group == g {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		path := filepath.Join(dir, slug(g)+".png")
		f, err := os.Create(path)
		if err != nil {
			return nil, err
		}
		err = WriteChart(f, g, rows)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(relTo, path)
		if err != nil {
			rel = path
		}
		out[g] = filepath.ToSlash(rel)
	}
	return out, nil
}

// slug turns a group name into a file name.
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
