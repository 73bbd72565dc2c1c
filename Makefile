# The two commands a newcomer needs are `make run` and `make test` (see README.md).

.PHONY: run test build fmt bench

run:
	@test -x bin/subscriberd || echo "First build: compiling subscriberd and its dependencies takes several minutes (about 7 on 2 cores); the packages are listed as they compile. Later builds take seconds."
	go build -v -o bin/subscriberd ./cmd/subscriberd && exec bin/subscriberd dev

test:
	./scripts/test.sh

build:
	CGO_ENABLED=0 go build -trimpath -o bin/subscriberd ./cmd/subscriberd

fmt:
	gofmt -w .

# bench builds and starts the service on a fresh local database with limits off, seeds 100k
# subscribers and runs every load scenario beside its raw-SQL baseline, and a few of them on
# three more instances with telemetry off, fully on and at the production setting (issues 6
# and 20), then imports a million rows three times (plain, with a webhook endpoint, 10 %
# pending): about 30 minutes on 2 cores, 50 with --passes 3. BENCH_ARGS passes options:
# BENCH_ARGS="--million", "--passes 3", "--profile", "--no-telemetry",
# "--markdown docs/benchmarks.md", or "--quick" (every scenario briefly, to check the tool);
# scripts/bench.sh --help lists them.
bench:
	./scripts/bench.sh $(BENCH_ARGS)
