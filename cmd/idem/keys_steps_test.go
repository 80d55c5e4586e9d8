package main

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsqlite"
)

// TestKeysGetShowsSteps: an operation run with recovery points shows its
// recorded steps under keys get; after a failed attempt released the key,
// keys get still finds the operation by its steps (a retry resumes after
// them), and --json lists them.
func TestKeysGetShowsSteps(t *testing.T) {
	t.Parallel()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	s, err := idemsqlite.Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := idem.NewGuard(s, nil)
	call := idem.Call{Scope: "rides", Key: "ride-7"}
	errDeclined := errors.New("mailer down")
	op := func(failReceipt bool) error {
		_, err := g.Do(t.Context(), call, func(ctx context.Context, run idem.Run) ([]byte, error) {
			steps := idem.StepsOf(run)
			if _, err := steps.Do(ctx, "create-ride", func(context.Context, idem.Step) ([]byte, error) { return []byte("ride_1"), nil }); err != nil {
				return nil, err
			}
			if _, err := steps.Do(ctx, "charge", func(context.Context, idem.Step) ([]byte, error) { return []byte("ch_1"), nil }); err != nil {
				return nil, err
			}
			if failReceipt {
				return nil, errDeclined
			}
			return []byte("done"), nil
		})
		return err
	}
	if err := op(true); !errors.Is(err, errDeclined) {
		t.Fatalf("first attempt: %v, want %v", err, errDeclined)
	}

	r := runCLI(t, nil, "keys", "get", "--store", dsn, "--scope", "rides", "ride-7")
	wantExit(t, r, exitOK)
	for _, w := range []string{"state          released", "steps (recovery points; a retry resumes after the last):",
		"create-ride", `"ride_1"`, "charge", `"ch_1"`, "steps expire "} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("keys get of a released operation lacks %q:\n%s", w, r.Stdout)
		}
	}

	if err := op(false); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, nil, "keys", "get", "--store", dsn, "--scope", "rides", "ride-7", "--json")
	wantExit(t, r, exitOK)
	var got struct {
		State string `json:"state"`
		Steps []struct {
			Seq        int    `json:"seq"`
			Name       string `json:"name"`
			ResultText string `json:"result_text"`
		} `json:"steps"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &got); err != nil {
		t.Fatalf("%v:\n%s", err, r.Stdout)
	}
	if got.State != string(idem.StateCompleted) || len(got.Steps) != 2 || got.Steps[0].Name != "create-ride" ||
		got.Steps[1].Seq != 2 || got.Steps[1].ResultText != "ch_1" {
		t.Fatalf("keys get --json: %+v", got)
	}

	// A key with neither record nor steps is still "not found".
	wantExit(t, runCLI(t, nil, "keys", "get", "--store", dsn, "--scope", "rides", "ride-8"), exitFailure, "not found")
}
