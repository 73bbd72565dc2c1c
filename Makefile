.PHONY: bench

# bench builds and starts the service on a fresh local database with limits off, seeds 100k
# subscribers and runs every load scenario beside its raw-SQL baseline (issue 6).
# BENCH_ARGS passes options, e.g. BENCH_ARGS="--million" or BENCH_ARGS="--profile".
bench:
	./scripts/bench.sh $(BENCH_ARGS)
