// Package e2e holds end-to-end tests that drive real Kafka clients (Go
// libraries in-process; kcat, Python and Node programs as child processes)
// against an in-process kfake cluster, directly and through dedupproxy,
// with a fault-injecting TCP shim in front.
//
// The package has no code of its own: everything is in _test.go files and
// testdata/. What the tests need besides Go is installed by .ci/deps (which
// .ci/run calls): kcat, python3-confluent-kafka and python3-kafka from
// Debian, node and npm, and kafkajs (`npm ci` in this directory). A missing
// client fails its test, saying what installs it, so a green run has run
// every client; E2E_SKIP_MISSING=kafkajs,kcat (or =all) skips the ones named
// instead, outside CI. Either way the run ends by naming every client that
// did not run and why (shown with -v, or when the run fails).
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
// How each client behaves on a lost acknowledgement, and why the shim
// closes the connection after dropping a response, is measured in
// docs/clients.md.
package e2e
