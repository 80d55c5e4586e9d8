package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// GroupLoad is the machine's load while one group of the report ran: the
// 1-minute load average at its start and end and, where the kernel counts
// it (/proc/stat), the share of CPU time stolen by the hypervisor and
// spent outside idle over the group.
type GroupLoad struct {
	Start, End time.Time
	// Load1Start and Load1End are the 1-minute load averages (-1: unknown).
	Load1Start, Load1End float64
	// Busy and Steal are fractions of all CPU time over the group (-1:
	// unknown).
	Busy, Steal float64
}

// String is the report's line for the group.
func (l GroupLoad) String() string {
	var parts []string
	if l.Load1Start >= 0 && l.Load1End >= 0 {
		parts = append(parts, fmt.Sprintf("load average %.2f → %.2f", l.Load1Start, l.Load1End))
	}
	if l.Busy >= 0 {
		parts = append(parts, fmt.Sprintf("CPU busy %.0f%%", 100*l.Busy))
	}
	if l.Steal >= 0 {
		parts = append(parts, fmt.Sprintf("steal %.1f%%", 100*l.Steal))
	}
	if !l.Start.IsZero() && !l.End.IsZero() {
		parts = append(parts, fmt.Sprintf("over %s", l.End.Sub(l.Start).Round(time.Second)))
	}
	if len(parts) == 0 {
		return "not available on this system"
	}
	return strings.Join(parts, ", ")
}

// loadProbe reads the machine's load at a group's start and end.
type loadProbe struct {
	start     time.Time
	load1     float64
	cpu       cpuTimes
	procStat  string
	procLoad  string
	haveStart bool
}

func startLoad() *loadProbe {
	p := &loadProbe{procStat: "/proc/stat", procLoad: "/proc/loadavg"}
	p.begin()
	return p
}

func (p *loadProbe) begin() {
	p.start = time.Now()
	p.load1 = readLoad1(p.procLoad)
	p.cpu, p.haveStart = readCPU(p.procStat)
}

func (p *loadProbe) end() GroupLoad {
	l := GroupLoad{Start: p.start, End: time.Now(), Load1Start: p.load1, Load1End: readLoad1(p.procLoad), Busy: -1, Steal: -1}
	if now, ok := readCPU(p.procStat); ok && p.haveStart {
		d := now.sub(p.cpu)
		if total := d.total(); total > 0 {
			l.Busy = float64(total-d.idle-d.iowait) / float64(total)
			if d.hasSteal {
				l.Steal = float64(d.steal) / float64(total)
			}
		}
	}
	return l
}

func readLoad1(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// cpuTimes are the aggregate "cpu" line of /proc/stat, in clock ticks.
type cpuTimes struct {
	user, nice, system, idle, iowait, irq, softirq, steal uint64
	hasSteal                                              bool
}

func (c cpuTimes) total() uint64 {
	return c.user + c.nice + c.system + c.idle + c.iowait + c.irq + c.softirq + c.steal
}

func (c cpuTimes) sub(o cpuTimes) cpuTimes {
	return cpuTimes{c.user - o.user, c.nice - o.nice, c.system - o.system, c.idle - o.idle, c.iowait - o.iowait,
		c.irq - o.irq, c.softirq - o.softirq, c.steal - o.steal, c.hasSteal && o.hasSteal}
}

// readCPU parses the first line of /proc/stat ("cpu  user nice system
// idle iowait irq softirq steal …"); steal is there since Linux 2.6.11.
func readCPU(path string) (cpuTimes, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return cpuTimes{}, false
	}
	return parseCPU(string(b))
}

func parseCPU(stat string) (cpuTimes, bool) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}, false
	}
	v := make([]uint64, 8)
	for i := range v {
		if i+1 >= len(f) {
			break
		}
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return cpuTimes{}, false
		}
		v[i] = n
	}
	return cpuTimes{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], len(f) > 8}, true
}

// NoisySpread is the max/min ratio of a row's runs above which the row is
// noisy: it is rerun once and, if still noisy, marked in the report.
const NoisySpread = 2.0

// Noisy reports whether r's runs spread more than NoisySpread.
func (r Result) Noisy() bool {
	return len(r.Rates) > 1 && r.Min() > 0 && r.Max()/r.Min() > NoisySpread
}

// rerunNoisy makes the runs of the group's noisy rows again, once,
// interleaved as the first time, and keeps the new runs; the first ones go
// to FirstRates.
func rerunNoisy(measure func(rows []int), results []Result) {
	var noisy []int
	for i := range results {
		if results[i].Err == nil && results[i].Noisy() {
			noisy = append(noisy, i)
		}
	}
	if len(noisy) == 0 {
		return
	}
	for _, i := range noisy {
		results[i].FirstRates, results[i].Rates = results[i].Rates, nil
		results[i].Rerun = true
	}
	measure(noisy)
	for _, i := range noisy {
		if results[i].Err != nil {
			// The rerun failed: the first runs stand, and the report
			// says why.
			results[i].Rates, results[i].RerunErr, results[i].Err = results[i].FirstRates, results[i].Err, nil
		}
	}
}

// indexes returns 0, 1, …, n-1.
func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
