// Package wire holds the Kafka-protocol endpoints the bench puts on the
// wire beside the proxy: the floor relay the proxy is measured against
// ([Floor]), a sink upstream that answers at once and keeps nothing
// ([Sink]), and the fault shim that drops Produce acknowledgements
// ([Shim]). None of them decides anything; see bench/README.md.
package wire
