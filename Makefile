# The two commands a newcomer needs are `make run` and `make test` (see README.md).

.PHONY: run test build fmt

run:
	go run ./cmd/subscriberd serve

test:
	./scripts/test.sh

build:
	CGO_ENABLED=0 go build -trimpath -o bin/subscriberd ./cmd/subscriberd

fmt:
	gofmt -w .
