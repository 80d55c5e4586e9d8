package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest/faultnet"
)

// runConfig is the run mode's flags.
type runConfig struct {
	messages int
	workers  int
	// dupRate and poisonEvery: a message is published twice with
	// probability dupRate; every poisonEvery-th message is poison.
	dupRate     float64
	poisonEvery int
	// rate paces publishing (messages a second, 0: unpaced), so that the
	// faults land while messages flow.
	rate float64
	// killEvery and faultEvery are ranges [min, max) between two kills,
	// and between two network faults; zombieEvery between two SIGSTOPs.
	killEvery, faultEvery [2]time.Duration
	zombieEvery           time.Duration
	// restartEvery is the range between two crashes of a private server,
	// restartPause how long it stays down.
	restartEvery   [2]time.Duration
	restartPause   time.Duration
	lease, ackWait time.Duration
	faults         bool
	timeout        time.Duration
	shutdownBound  time.Duration
	keep           bool
	// progress is how often a long run says how far it got (0: never).
	progress time.Duration
	logDir   string
	seed     uint64
}

// publish is one publish: a message id, its kind, and whether it is a
// duplicate (the message's second publish).
type publish struct {
	id, kind string
	dup      bool
}

// plan returns the publishes of a run: every message once, 30% of them
// (dupRate) again later, as a producer's retry does.
func plan(cfg *runConfig, rng *rand.Rand) (msgs []publish, poison int) {
	type slot struct {
		at float64
		p  publish
	}
	var slots []slot
	// A duplicate follows its original by up to spread publishes: far
	// enough, even unpaced, that most land outside JetStream's duplicate
	// window and reach the consumers.
	spread := float64(max(200, cfg.messages/10))
	for i := range cfg.messages {
		kind := kindOK
		if cfg.poisonEvery > 0 && i%cfg.poisonEvery == cfg.poisonEvery/2 {
			kind = kindFail
			if (i/cfg.poisonEvery)%2 == 1 {
				kind = kindPerm
			}
			poison++
		}
		p := publish{id: "m" + itoa(i), kind: kind}
		slots = append(slots, slot{float64(i), p})
		if rng.Float64() < cfg.dupRate {
			p.dup = true
			slots = append(slots, slot{float64(i) + 1 + rng.Float64()*spread, p})
		}
	}
	sort.SliceStable(slots, func(a, b int) bool { return slots[a].at < slots[b].at })
	for _, s := range slots {
		msgs = append(msgs, s.p)
	}
	return msgs, poison
}

// result is one scenario's numbers.
type result struct {
	name                            string
	edge                            bool
	published, dups, brokerDeduped  int
	messages, poison                int
	kills, stops, exits             int
	cuts, stalls, delays, restarts  int
	effects, lost, duplicated       int
	calls                           int
	dead                            map[idem.DeadReason]int
	deadRecords, deadIDs, wrongDead int
	settled                         bool
	settle, wall, slowestExit       time.Duration
	overdue                         int
	err                             error
	lostIDs, dupIDs, wrongIDs       []string
	notes                           []string
}

func (r *result) passed() bool {
	return r.err == nil && r.settled && r.lost == 0 && r.wrongDead == 0 && (r.edge || r.duplicated == 0)
}

// runScenario runs one scenario end to end.
func runScenario(ctx context.Context, exe string, sc *scenario, cfg *runConfig, log io.Writer) *result {
	start := time.Now()
	res := &result{name: sc.name, edge: sc.edge, dead: map[idem.DeadReason]int{}}
	rng := rand.New(rand.NewPCG(cfg.seed, uint64(len(sc.name))))
	run := fmt.Sprintf("%s_%d", strings.ReplaceAll(sc.name, "-", "_"), time.Now().UnixNano()%1e9)
	dir, err := os.MkdirTemp("", "idem-chaos-")
	if err != nil {
		res.err = err
		return res
	}
	defer os.RemoveAll(dir)
	e := &env{sc: sc, cfg: cfg, relays: map[string]*faultnet.Relay{}, dir: dir,
		base: spec{Scenario: sc.name, Run: run, Lease: cfg.lease, AckWait: cfg.ackWait}}
	defer e.close()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = sc.setup(e, sctx)
	cancel()
	if err != nil {
		res.err = fmt.Errorf("set-up: %w", err)
		return res
	}

	msgs, poison := plan(cfg, rng)
	res.published, res.messages, res.poison = len(msgs), cfg.messages, poison
	res.dups = len(msgs) - cfg.messages
	kinds := make(map[string]string, cfg.messages)
	for _, m := range msgs {
		kinds[m.id] = m.kind
	}

	wlog := io.Discard
	if cfg.logDir != "" {
		f, err := os.Create(filepath.Join(cfg.logDir, sc.name+".log"))
		if err == nil {
			defer f.Close()
			wlog = f
		}
	}
	fl := newFleet(exe, e.base, cfg.workers, wlog)
	closed := false
	closeFleet := func() {
		if !closed {
			closed = true
			fl.close(cfg.shutdownBound)
		}
	}
	defer closeFleet()

	rctx, stopRun := context.WithTimeout(ctx, cfg.timeout)
	defer stopRun()
	pubErr := make(chan error, 1)
	pubDone := make(chan struct{})
	go func() {
		err := sc.publish(e, rctx, msgs)
		close(pubDone)
		pubErr <- err
	}()
	chaosDone := make(chan struct{})
	chaosStopped := make(chan struct{})
	// restarted is closed after the private server's first crash: a run
	// that restarts a server is not over before it did.
	restarted := make(chan struct{})
	if e.private == nil {
		close(restarted)
	}
	go func() {
		defer close(chaosStopped)
		chaos(rctx, chaosDone, pubDone, restarted, fl, e, sc, cfg, rng, res)
	}()

	// Wait until every message has an effect or a dead letter.
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	published := false
	lastProgress := time.Now()
wait:
	for {
		select {
		case err := <-pubErr:
			if err != nil {
				res.err = fmt.Errorf("publish: %w", err)
				break wait
			}
			published = true
		case <-rctx.Done():
			break wait
		case <-tick.C:
		}
		if !published {
			continue
		}
		select {
		case <-restarted:
		default:
			continue
		}
		done, n, err := settled(rctx, e, sc, cfg.messages)
		if err != nil {
			continue // a fault of ours, or the run's end: try again
		}
		if cfg.progress > 0 && time.Since(lastProgress) >= cfg.progress {
			lastProgress = time.Now()
			fmt.Fprintf(log, "    ... %s: %d of %d settled after %s\n", sc.name, n, cfg.messages, time.Since(start).Round(time.Second))
		}
		if done {
			res.settled = true
			res.settle = time.Since(start)
			break
		}
	}
	close(chaosDone)
	<-chaosStopped
	closeFleet()
	res.kills, res.stops, res.exits = fl.kills, fl.stops, fl.exits
	res.slowestExit, res.overdue = fl.slowestExit, fl.overdue

	// Count after every worker is gone, so a zombie's late effect counts.
	time.Sleep(500 * time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := check(cctx, e, sc, kinds, res); err != nil && res.err == nil {
		res.err = fmt.Errorf("check: %w", err)
	}
	if sc.notes != nil {
		res.notes = sc.notes(e, cctx)
	}
	res.wall = time.Since(start)
	return res
}

// settled reports whether every message has an effect or a dead letter,
// and how many do.
func settled(ctx context.Context, e *env, sc *scenario, n int) (bool, int, error) {
	eff, err := sc.effects(e, ctx)
	if err != nil {
		return false, 0, err
	}
	if sc.refreshDead != nil {
		if err := sc.refreshDead(e, ctx); err != nil {
			return false, 0, err
		}
	}
	seen := len(eff)
	e.mu.Lock()
	for _, d := range e.dead {
		if eff[d.id] == 0 {
			eff[d.id] = -1 // counted once
			seen++
		}
	}
	e.mu.Unlock()
	return seen >= n, seen, nil
}

// chaos injects the faults until done: a SIGKILL every killEvery, a
// SIGSTOP every zombieEvery, a network fault every faultEvery.
func chaos(ctx context.Context, done, published <-chan struct{}, restarted chan<- struct{}, fl *fleet, e *env, sc *scenario, cfg *runConfig, rng *rand.Rand, res *result) {
	between := func(r [2]time.Duration) time.Duration {
		return r[0] + time.Duration(rng.Int64N(int64(r[1]-r[0])+1))
	}
	killEvery, faultEvery, zombieEvery := cfg.killEvery, cfg.faultEvery, cfg.zombieEvery
	if sc.slow > 1 {
		stretch := func(d time.Duration) time.Duration { return time.Duration(float64(d) * sc.slow) }
		killEvery = [2]time.Duration{stretch(killEvery[0]), stretch(killEvery[1])}
		faultEvery = [2]time.Duration{stretch(faultEvery[0]), stretch(faultEvery[1])}
		zombieEvery = stretch(zombieEvery)
	}
	var nextKill, nextStop, nextFault, nextRestart <-chan time.Time
	if !sc.calm {
		nextKill = time.After(between(killEvery))
		nextStop = time.After(zombieEvery)
	}
	if e.private != nil {
		nextRestart = time.After(between(cfg.restartEvery))
		if sc.restart == "nats" {
			// A broker: at once when everything is published (the
			// publisher does not outlive a broker crash), while the
			// consumers still have work.
			nextRestart = time.After(0)
		}
	}
	relays := make([]string, 0, len(e.relays))
	for name := range e.relays {
		relays = append(relays, name)
	}
	slices.Sort(relays)
	if len(relays) > 0 && !sc.calm {
		nextFault = time.After(between(faultEvery))
	}
	// A zombie sleeps past the lease (or AckWait): the longest of them,
	// plus a margin for a loaded machine.
	zombie := max(cfg.lease, cfg.ackWait) + time.Second
	if !sc.leased {
		zombie = time.Second
	}
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-nextKill:
			fl.kill()
			nextKill = time.After(between(killEvery))
		case <-nextStop:
			fl.stop(zombie)
			nextStop = time.After(zombieEvery)
		case <-nextRestart:
			if sc.restart == "nats" { // a broker: once everything is published
				select {
				case <-published:
				default:
					nextRestart = time.After(50 * time.Millisecond)
					continue
				}
			}
			if err := e.private.crash(ctx, cfg.restartPause); err != nil {
				fmt.Fprintf(os.Stderr, "chaos: %s: restart %s: %v\n", sc.name, sc.restart, err)
			}
			if res.restarts++; res.restarts == 1 {
				close(restarted)
			}
			nextRestart = time.After(between(cfg.restartEvery))
		case <-nextFault:
			r := e.relays[relays[rng.IntN(len(relays))]]
			switch rng.IntN(3) {
			case 0: // cut every connection
				r.CloseConns()
				res.cuts++
			case 1: // stall: answers stop coming, then the connections die
				r.Set(faultnet.Fault{Hang: true})
				sleepOr(done, 500*time.Millisecond+time.Duration(rng.IntN(1000))*time.Millisecond)
				r.Set(faultnet.Fault{})
				r.CloseConns()
				res.stalls++
			case 2: // delay both ways
				d := time.Duration(5+rng.IntN(45)) * time.Millisecond
				r.Set(faultnet.Fault{RequestDelay: d, ResponseDelay: d})
				sleepOr(done, time.Second+time.Duration(rng.IntN(1000))*time.Millisecond)
				r.Set(faultnet.Fault{})
				res.delays++
			}
			nextFault = time.After(between(faultEvery))
		}
	}
}

func sleepOr(done <-chan struct{}, d time.Duration) {
	select {
	case <-done:
	case <-time.After(d):
	}
}

// check counts effects and dead letters against what was published.
func check(ctx context.Context, e *env, sc *scenario, kinds map[string]string, res *result) error {
	eff, err := sc.effects(e, ctx)
	if err != nil {
		return err
	}
	if sc.refreshDead != nil {
		if err := sc.refreshDead(e, ctx); err != nil {
			return err
		}
	}
	if sc.calls != nil {
		calls, err := sc.calls(e, ctx)
		if err != nil {
			return err
		}
		for _, n := range calls {
			res.calls += n
		}
	}
	e.mu.Lock()
	res.brokerDeduped = e.brokerDeduped
	dead := map[string]idem.DeadReason{}
	dlids := map[string]bool{}
	res.deadRecords = len(e.dead)
	for _, d := range e.dead {
		if d.dlid != "" {
			dlids[d.dlid] = true
		}
		if _, ok := dead[d.id]; !ok {
			dead[d.id] = d.reason
		}
	}
	res.deadIDs = len(dlids)
	e.mu.Unlock()
	for id, n := range eff {
		if _, ok := kinds[id]; !ok {
			// An effect of a message never published (the outbox
			// scenarios: of a rolled-back transaction's event).
			res.wrongDead++
			res.wrongIDs = append(res.wrongIDs, id+"(effect, never published)")
		}
		res.effects += n
		if n > 1 {
			res.duplicated += n - 1
			res.dupIDs = append(res.dupIDs, id)
		}
	}
	for id, kind := range kinds {
		reason, isDead := dead[id]
		if isDead {
			res.dead[reason]++
		}
		switch {
		case eff[id] == 0 && !isDead:
			res.lost++
			res.lostIDs = append(res.lostIDs, id)
		case kind == kindOK && isDead, kind != kindOK && eff[id] > 0,
			isDead && reason != expectedReason(kind):
			res.wrongDead++
			res.wrongIDs = append(res.wrongIDs, fmt.Sprintf("%s(%s:%s)", id, kind, reason))
		}
	}
	for id := range dead {
		if _, ok := kinds[id]; !ok {
			res.wrongDead++
			res.wrongIDs = append(res.wrongIDs, id+"(unknown)")
		}
	}
	return nil
}

// report prints one scenario's numbers.
func (r *result) report(w io.Writer) {
	verdict := "PASS"
	if !r.passed() {
		verdict = "FAIL"
	}
	if r.edge {
		verdict += " (edge: duplicates measured)"
	}
	fmt.Fprintf(w, "--- %s: %s\n", r.name, verdict)
	if r.err != nil {
		fmt.Fprintf(w, "    error: %v\n", r.err)
	}
	fmt.Fprintf(w, "    published %d (%d messages, %d duplicate publishes, %d dropped by the broker/inbox, %d poison)\n",
		r.published, r.messages, r.dups, r.brokerDeduped, r.poison)
	fmt.Fprintf(w, "    faults: %d kills, %d stops, %d cuts, %d stalls, %d delays, %d server restarts, %d worker exits\n",
		r.kills, r.stops, r.cuts, r.stalls, r.delays, r.restarts, r.exits)
	fmt.Fprintf(w, "    effects %d, lost %d, duplicated %d", r.effects, r.lost, r.duplicated)
	if r.calls > 0 {
		fmt.Fprintf(w, ", downstream calls %d", r.calls)
	}
	fmt.Fprintln(w)
	reasons := make([]string, 0, len(r.dead))
	total := 0
	for reason, n := range r.dead {
		reasons = append(reasons, fmt.Sprintf("%s %d", reason, n))
		total += n
	}
	slices.Sort(reasons)
	fmt.Fprintf(w, "    dead-lettered %d (%s), wrong %d; dead-letter records %d, distinct dead-letter ids %d\n",
		total, strings.Join(reasons, ", "), r.wrongDead, r.deadRecords, r.deadIDs)
	settle := "not settled"
	if r.settled {
		settle = "settled in " + r.settle.Round(100*time.Millisecond).String()
	}
	for _, n := range r.notes {
		fmt.Fprintf(w, "    %s\n", n)
	}
	fmt.Fprintf(w, "    %s, wall %s, slowest shutdown %s (%d past the bound)\n",
		settle, r.wall.Round(100*time.Millisecond), r.slowestExit.Round(10*time.Millisecond), r.overdue)
	for _, l := range []struct {
		what string
		ids  []string
	}{{"lost", r.lostIDs}, {"duplicated", r.dupIDs}, {"wrong", r.wrongIDs}} {
		if len(l.ids) > 0 {
			slices.Sort(l.ids)
			fmt.Fprintf(w, "    %s: %s\n", l.what, strings.Join(l.ids[:min(len(l.ids), 10)], " "))
		}
	}
}
