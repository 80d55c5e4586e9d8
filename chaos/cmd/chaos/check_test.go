package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/idem-go/idem"
)

func TestPlan(t *testing.T) {
	cfg := &runConfig{messages: 1000, dupRate: 0.3, poisonEvery: 100}
	msgs, poison := plan(cfg, rand.New(rand.NewPCG(1, 2)))
	if poison != 10 {
		t.Fatalf("poison = %d, want 10", poison)
	}
	first := map[string]int{}
	kinds := map[string]int{}
	dups := 0
	for i, m := range msgs {
		if m.dup {
			dups++
			at, ok := first[m.id]
			if !ok || at > i {
				t.Fatalf("duplicate of %s at %d before its first publish", m.id, i)
			}
			continue
		}
		if _, ok := first[m.id]; ok {
			t.Fatalf("%s published twice as an original", m.id)
		}
		first[m.id] = i
		kinds[m.kind]++
	}
	if len(first) != 1000 || len(msgs) != 1000+dups {
		t.Fatalf("%d originals, %d publishes, %d duplicates", len(first), len(msgs), dups)
	}
	if dups < 250 || dups > 350 {
		t.Errorf("duplicates = %d, want about 300", dups)
	}
	if kinds[kindPerm] != 5 || kinds[kindFail] != 5 {
		t.Errorf("poison kinds %v, want 5 perm and 5 fail", kinds)
	}
}

func TestParseBody(t *testing.T) {
	id, kind := parseBody(body("m7", kindPerm))
	if id != "m7" || kind != kindPerm {
		t.Fatalf("parseBody = %q, %q", id, kind)
	}
	if expectedReason(kindPerm) != idem.DeadPermanent || expectedReason(kindFail) != idem.DeadMaxAttempts || expectedReason(kindOK) != "" {
		t.Fatal("expectedReason")
	}
	if poison(kindOK) != nil || poison(kindFail) == nil || poison(kindPerm) == nil {
		t.Fatal("poison")
	}
}

// checkOf runs check over given effects and dead letters.
func checkOf(t *testing.T, edge bool, kinds map[string]string, effects map[string]int, dead []deadLetter) *result {
	t.Helper()
	sc := &scenario{edge: edge, effects: func(*env, context.Context) (map[string]int, error) { return effects, nil }}
	e := &env{sc: sc, dead: dead}
	res := &result{edge: edge, settled: true, dead: map[idem.DeadReason]int{}}
	if err := check(context.Background(), e, sc, kinds, res); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestCheck(t *testing.T) {
	kinds := map[string]string{"a": kindOK, "b": kindOK, "c": kindOK, "p": kindPerm, "f": kindFail}
	dl := func(id, kind string, reason idem.DeadReason, dlid string) deadLetter {
		return deadLetter{id: id, kind: kind, reason: reason, dlid: dlid}
	}
	t.Run("clean", func(t *testing.T) {
		res := checkOf(t, false, kinds, map[string]int{"a": 1, "b": 1, "c": 1},
			[]deadLetter{dl("p", kindPerm, idem.DeadPermanent, "x"), dl("f", kindFail, idem.DeadMaxAttempts, "y"),
				dl("f", kindFail, idem.DeadMaxAttempts, "y")})
		if !res.passed() || res.effects != 3 || res.deadRecords != 3 || res.deadIDs != 2 ||
			res.dead[idem.DeadPermanent] != 1 || res.dead[idem.DeadMaxAttempts] != 1 {
			t.Fatalf("%+v", res)
		}
	})
	t.Run("lost and duplicated", func(t *testing.T) {
		res := checkOf(t, false, kinds, map[string]int{"a": 2, "b": 1},
			[]deadLetter{dl("p", kindPerm, idem.DeadPermanent, ""), dl("f", kindFail, idem.DeadMaxAttempts, "")})
		if res.passed() || res.lost != 1 || res.duplicated != 1 ||
			!slices.Equal(res.lostIDs, []string{"c"}) || !slices.Equal(res.dupIDs, []string{"a"}) {
			t.Fatalf("%+v", res)
		}
	})
	t.Run("edge passes with duplicates, not with losses", func(t *testing.T) {
		dead := []deadLetter{dl("p", kindPerm, idem.DeadPermanent, ""), dl("f", kindFail, idem.DeadMaxAttempts, "")}
		if res := checkOf(t, true, kinds, map[string]int{"a": 3, "b": 1, "c": 1}, dead); !res.passed() || res.duplicated != 2 {
			t.Fatalf("%+v", res)
		}
		if res := checkOf(t, true, kinds, map[string]int{"a": 3, "b": 1}, dead); res.passed() {
			t.Fatalf("an edge scenario with a lost effect passed: %+v", res)
		}
	})
	t.Run("wrong dead letters", func(t *testing.T) {
		res := checkOf(t, false, kinds, map[string]int{"a": 1, "b": 1, "p": 1},
			[]deadLetter{dl("c", kindOK, idem.DeadPermanent, ""), dl("f", kindFail, idem.DeadPermanent, ""),
				dl("zz", kindOK, idem.DeadPermanent, "")})
		// c dead though fine, p had an effect and no dead letter, f's
		// reason is wrong, zz was never published.
		if res.passed() || res.wrongDead != 4 || res.lost != 0 {
			t.Fatalf("%+v", res)
		}
	})
	t.Run("not settled", func(t *testing.T) {
		res := checkOf(t, false, kinds, map[string]int{"a": 1, "b": 1, "c": 1},
			[]deadLetter{dl("p", kindPerm, idem.DeadPermanent, ""), dl("f", kindFail, idem.DeadMaxAttempts, "")})
		res.settled = false
		if res.passed() {
			t.Fatal("an unsettled run passed")
		}
	})
	t.Run("effects unreadable", func(t *testing.T) {
		boom := errors.New("boom")
		sc := &scenario{effects: func(*env, context.Context) (map[string]int, error) { return nil, boom }}
		if err := check(context.Background(), &env{sc: sc}, sc, kinds, &result{}); !errors.Is(err, boom) {
			t.Fatalf("check = %v, want boom", err)
		}
		if _, _, err := settled(context.Background(), &env{sc: sc}, sc, 1); !errors.Is(err, boom) {
			t.Fatalf("settled = %v, want boom", err)
		}
	})
}

func TestSettled(t *testing.T) {
	sc := &scenario{effects: func(*env, context.Context) (map[string]int, error) { return map[string]int{"a": 1, "b": 2}, nil }}
	e := &env{sc: sc, dead: []deadLetter{{id: "p"}, {id: "p"}, {id: "a"}}}
	for n, want := range map[int]bool{3: true, 4: false} {
		if got, seen, err := settled(context.Background(), e, sc, n); err != nil || got != want || seen != 3 {
			t.Errorf("settled(%d) = %v, %d, %v; want %v, 3", n, got, seen, err, want)
		}
	}
}

func TestSelectScenarios(t *testing.T) {
	if sel, unknown := selectScenarios("", false); len(sel) != len(scenarios) || unknown != nil {
		t.Fatal("empty list")
	}
	sel, _ := selectScenarios("all", true)
	for _, s := range sel {
		if s.heavy {
			t.Errorf("quick selects %s", s.name)
		}
	}
	if len(sel) == len(scenarios) {
		t.Error("quick selects every scenario")
	}
	if sel, _ := selectScenarios("kafka-dynamic-postgres", true); len(sel) != 1 {
		t.Error("a heavy scenario named in quick mode is not run")
	}
	sel, unknown := selectScenarios("amqp-postgres, nope", false)
	if len(sel) != 1 || sel[0].name != "amqp-postgres" || !slices.Equal(unknown, []string{" nope"}) {
		t.Fatalf("%v %v", sel, unknown)
	}
}

func TestSpecEnv(t *testing.T) {
	s := spec{Scenario: "amqp-postgres", Run: "r1", Worker: 2}
	t.Setenv(specEnv, s.env()[len(specEnv)+1:])
	got, err := specFromEnv()
	if err != nil || got.Scenario != s.Scenario || got.Run != s.Run || got.Worker != 2 {
		t.Fatalf("specFromEnv = %+v, %v", got, err)
	}
	t.Setenv(specEnv, "{")
	if _, err := specFromEnv(); err == nil {
		t.Fatal("a bad spec parsed")
	}
	t.Setenv(specEnv, "")
	if _, err := specFromEnv(); err == nil {
		t.Fatal("no spec parsed")
	}
}
