# Every target loops over the modules of the workspace (go.work), so a user
# who only wants the Kafka adapter never downloads pgx, and `make test` still
# covers everything.
MODULES := $(shell go list -m -f '{{.Dir}}' 2>/dev/null)
GO ?= go
STATICCHECK_VERSION ?= v0.8.2
BENCHTIME ?= 1s

.PHONY: test test/race test/short lint tidy installcheck bench bench-go bench-quick fmt vet staticcheck demo

## test: every module's tests with the race detector (service-backed tests skip
## without IDEM_*_URL locally and fail under CI=true).
test: test/race

test/race:
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) test -race -count=1 -timeout 10m ./...); done

test/short:
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) test -short -count=1 ./...); done

fmt:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

staticcheck:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...); done

## lint: gofmt, go vet and staticcheck over every module.
lint: fmt vet staticcheck

## tidy: go mod tidy in every module as a user's go command would resolve it:
## no go.mod has a replace directive (go.work maps the siblings to the
## checkout for local work only), so tidy runs with GOWORK=off against a file
## module proxy made from the checkout (tools/modproxy) and a fresh module
## cache. go.sum keeps no lines for our own modules: their hashes change with
## every commit (docs/RELEASING.md).
tidy:
	.ci/installcheck --tidy

## installcheck: go install cmd/idem, build a user module and check that
## every module is tidy, all against the modules as they would be published.
installcheck:
	.ci/installcheck

## bench: the side-by-side report (BENCHMARKS.md and docs/bench/*.png).
bench: bench-report

## bench-go: every module's Go benchmarks, for real.
bench-go:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchmem -benchtime=$(BENCHTIME) ./...); done

## bench-quick: every benchmark once, so that none of them rots (no timings judged).
bench-quick:
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchtime=1x ./...); done

## demo: the README's main job.
demo:
	$(GO) run ./cmd/idem/demo

## bench-report: the side-by-side comparison (idem vs textbook, River,
## Watermill and the raw ceilings) in one run against the same servers;
## writes BENCHMARKS.md and docs/bench/*.png. Needs IDEM_POSTGRES_URL and
## IDEM_REDIS_URL. About ten minutes on two cores.
.PHONY: bench-report bench-report-quick
bench-report:
	cd bench && $(GO) run ./cmd/idembench --out ../BENCHMARKS.md --charts ../docs/bench $(BENCH_REPORT_FLAGS)

## bench-report-quick: every scenario of the report once at a small size
## (CI: checks that each runs and the report is well formed; no timings
## judged). Writes to a temporary directory, not to BENCHMARKS.md.
bench-report-quick:
	@d=$$(mktemp -d) && cd bench && $(GO) run ./cmd/idembench --quick --out $$d/BENCHMARKS.md --charts $$d/charts && rm -rf $$d

## chaos: the reliability suite (RELIABILITY.md): every scenario at 100,000
## messages, consumers as processes SIGKILLed and SIGSTOPped, connections cut,
## stalled and delayed through faultnet relays; fails on any lost or
## duplicated effect. Needs the IDEM_*_URL servers (private names on them).
## Long (tens of minutes); not part of CI. CHAOS_FLAGS adds flags, e.g.
## CHAOS_FLAGS='-scenarios amqp-postgres -messages 20000'.
## chaos-quick: every scenario at 2,000 messages, 3 workers (CI, ~1.5 min).
.PHONY: chaos chaos-quick
CHAOS_FLAGS ?=
chaos:
	@d=$$(mktemp -d) && (cd chaos && $(GO) build -o $$d/chaos ./cmd/chaos) && $$d/chaos run $(CHAOS_FLAGS); rc=$$?; rm -rf $$d; exit $$rc

chaos-quick:
	@$(MAKE) --no-print-directory chaos CHAOS_FLAGS="-quick $(CHAOS_FLAGS)"
