.PHONY: run build test race fuzz bench lint kgo-suite lockcheck

run:
	go run ./cmd/dedupproxy

# The release build (static, as in deploy/Dockerfile): bin/dedupproxy.
build:
	deploy/build.sh bin/dedupproxy

test:
	go test ./...

race:
	go test -race ./...

# Each fuzz target for a short while; the committed corpus runs in `make test`.
FUZZTIME ?= 30s
fuzz:
	go test -run x -fuzz '^FuzzRewriteMetadata$$' -fuzztime $(FUZZTIME) ./protocol/rewrite
	go test -run x -fuzz '^FuzzRewriteResponse$$' -fuzztime $(FUZZTIME) ./protocol/rewrite
	go test -run x -fuzz '^FuzzReadFrame$$' -fuzztime $(FUZZTIME) ./protocol
	go test -run x -fuzz '^FuzzRequestHeader$$' -fuzztime $(FUZZTIME) ./protocol
	go test -run x -fuzz '^FuzzRewriteOmit$$' -fuzztime $(FUZZTIME) ./protocol/rewrite
	go test -run x -fuzz '^FuzzProduceHeader$$' -fuzztime $(FUZZTIME) ./protocol
	go test -run x -fuzz '^FuzzDropLeadingRecords$$' -fuzztime $(FUZZTIME) ./protocol
	go test -run x -fuzz '^FuzzRecordKeys$$' -fuzztime $(FUZZTIME) ./protocol
	go test -run x -fuzz '^FuzzRewriteTopTagsSameSize$$' -fuzztime $(FUZZTIME) ./protocol/rewrite
	go test -run x -fuzz '^FuzzProduceWalker$$' -fuzztime $(FUZZTIME) ./protocol
	go test -run x -fuzz '^FuzzTableVsModel$$' -fuzztime $(FUZZTIME) ./seqstate
	go test -run x -fuzz '^FuzzTailRead$$' -fuzztime $(FUZZTIME) ./decide
	go test -run x -fuzz '^FuzzRecordIDs$$' -fuzztime $(FUZZTIME) ./protocol
	go test -run x -fuzz '^FuzzPrincipalMappingRules$$' -fuzztime $(FUZZTIME) ./certprincipal

# The decision core takes one lock at a time (docs/architecture.md, "Locks").
lockcheck:
	go test -tags lockcheck -count=1 ./decide/...
	go test -tags lockcheck -count=1 -run 'TestSimulation$$' ./sim -args -seeds=300

bench:
	go test -run x -bench . -benchmem ./...

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	go vet ./...
	go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# franz-go's pkg/kgo tests through the proxy, in front of a local cluster
# (docs/real-cluster.md, "franz-go's own tests through the proxy").
kgo-suite:
	.ci/kgo-suite
