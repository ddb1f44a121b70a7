// Package e2e holds end-to-end tests that drive real Kafka clients (Go
// libraries in-process, confluent-kafka-go among them through cgo; kcat,
// Python and Node programs as child processes)
// against an in-process kfake cluster, directly and through dedupproxy,
// with a fault-injecting TCP shim in front.
//
// The package has no code of its own: everything is in _test.go files and
// testdata/. What the tests need besides Go is installed by .ci/deps (which
// .ci/run calls): kcat, python3-confluent-kafka and python3-kafka from
// Debian, node and npm, kafkajs (`npm ci` in this directory), and gcc, for
// confluent-kafka-go links the librdkafka its Go module bundles (a build
// with cgo off reports that client missing). A missing
// client fails its test, saying what installs it, so a green run has run
// every client; E2E_SKIP_MISSING=kafkajs,kcat (or =all) skips the ones named
// instead, outside CI. Every skip — a client missing, a fault a real
// cluster cannot inject — is listed with its reason when the run ends,
// even in a plain go test that shows nothing else of a passing package
// (internal/testskip). Nothing skips on a count: a miss the docs
// document asserts its bound instead (docs/legacy.md, "What is left").
//
// With DEDUPPROXY_TEST_UPSTREAM set (and its TLS and SASL variables) the
// tests run against that real cluster instead of kfake, on topics they
// create and delete; those that need kfake's fault hooks skip, saying which
// (docs/real-cluster.md).
//
// The legacy lost-acknowledgement tests write their figures to
// results/legacy-clients.md when run with -update or E2E_WRITE_RESULTS=1:
//
//	go test ./e2e -run TestLegacyLostAck -update
//
// With E2E_DEBUG=1 the in-process proxies log at debug level, the shim logs
// every Produce request (the values of each batch) and response, and a
// run that wrote records twice logs where each copy sits in the log: the
// retry shape the proxy missed can be read from that.
//
// How each client behaves on a lost acknowledgement, and why the shim
// closes the connection after dropping a response, is measured in
// docs/clients.md.
package e2e
