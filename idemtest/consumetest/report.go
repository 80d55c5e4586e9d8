package consumetest

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Report is what [Run] observed, one row per scenario, in the order they
// were played.
type Report struct {
	Scenarios []ScenarioResult
	// Points is how many [Point] calls a clean first delivery passed (the
	// most seen); 0 means the faults were injected at timed delays.
	Points int
}

// ScenarioResult is one scenario's row of the [Report].
type ScenarioResult struct {
	Scenario Scenario
	// Skipped says why the scenario was not played ("" when it was).
	Skipped string
	// Messages is how many distinct message ids it used.
	Messages int
	// Deliveries counts calls to Target.Deliver, including the ones that
	// failed, panicked or were killed.
	Deliveries int
	// Failed counts deliveries that returned an error, panicked or were
	// killed (expected in the fault scenarios, and for concurrent copies
	// that found the message in progress).
	Failed int
	// Effects is the sum of Target.Effects over the scenario's ids; Lost
	// and Duplicated count the ids with fewer and more effects than
	// expected.
	Effects, Lost, Duplicated int
	// Verdict is what the target did with the changed body (ChangedBody
	// only; the verdicts of several ids are combined).
	Verdict Verdict
	// Note says how the faults were injected, or anything else worth
	// knowing about the row.
	Note string
	// Failures are the scenario's failure messages, as given to t.Errorf.
	Failures []string
}

// Passed reports whether the scenario was played and found nothing wrong.
func (s ScenarioResult) Passed() bool { return s.Skipped == "" && len(s.Failures) == 0 }

// Failed reports whether any scenario failed.
func (r Report) Failed() bool {
	for _, s := range r.Scenarios {
		if len(s.Failures) > 0 {
			return true
		}
	}
	return false
}

// Scenario returns the row of s, and false when the report has none.
func (r Report) Scenario(s Scenario) (ScenarioResult, bool) {
	for _, x := range r.Scenarios {
		if x.Scenario == s {
			return x, true
		}
	}
	return ScenarioResult{}, false
}

// String renders the report as the table [Run] logs.
func (r Report) String() string {
	var b strings.Builder
	passed, failed, skipped := 0, 0, 0
	for _, s := range r.Scenarios {
		switch {
		case s.Skipped != "":
			skipped++
		case len(s.Failures) > 0:
			failed++
		default:
			passed++
		}
	}
	fmt.Fprintf(&b, "%d scenarios: %d passed, %d failed, %d skipped; %s in the handler\n",
		len(r.Scenarios), passed, failed, skipped, plural(r.Points, "point"))
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\tmessages\tdeliveries\tfailed\teffects\tlost\tduplicated\tresult")
	for _, s := range r.Scenarios {
		if s.Skipped != "" {
			fmt.Fprintf(w, "%s\t-\t-\t-\t-\t-\t-\tSKIP\t%s\n", s.Scenario, s.Skipped)
			continue
		}
		result := "ok"
		if len(s.Failures) > 0 {
			result = "FAIL"
		}
		note := s.Note
		if s.Verdict != 0 {
			note = strings.TrimPrefix(s.Verdict.String()+"; "+note, "; ")
			note = strings.TrimSuffix(note, "; ")
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", s.Scenario, s.Messages, s.Deliveries,
			s.Failed, s.Effects, s.Lost, s.Duplicated, result, note)
	}
	w.Flush()
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

// plural returns "n word" with an s when n is not 1.
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	if w, ok := strings.CutSuffix(word, "y"); ok {
		return strconv.Itoa(n) + " " + w + "ies"
	}
	return strconv.Itoa(n) + " " + word + "s"
}
