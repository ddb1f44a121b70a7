"""Legacy producer for e2e/legacy_test.go: kafka-python.

usage: kafka_python_producer.py BOOTSTRAP TOPIC N [RETRIES]

Writes values r-000000 .. r-{N-1} with acks=all, then prints one JSON line:
{"version", "acked": [indices], "failed": [indices], "errors": [first few]}.
Run with Debian's /usr/bin/python3 (python3-kafka).

kafka-python 2.0.2 (Debian's) has no idempotent producer at all, and its
default retries=0 means a lost acknowledgement is reported as a failure
although the broker appended the batch (docs/clients.md §3). With retries > 0
(RETRIES, default 5) it resends the batch on a new connection.
"""
import json
import os
import sys

import kafka


def main():
    bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    retries = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    acked, failed, errors = [], [], []

    def ok(i):
        return lambda _md: acked.append(i)

    def bad(i):
        def errback(exc):
            failed.append(i)
            if len(errors) < 5:
                errors.append(repr(exc))
        return errback

    # A real cluster with SASL (e2e: DEDUPPROXY_TEST_SASL_*), through the proxy.
    sasl = {}
    if os.environ.get("E2E_SASL_MECHANISM"):
        sasl = dict(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism=os.environ["E2E_SASL_MECHANISM"],
            sasl_plain_username=os.environ["E2E_SASL_USER"],
            sasl_plain_password=os.environ["E2E_SASL_PASSWORD"],
        )
    p = kafka.KafkaProducer(
        bootstrap_servers=[bootstrap],
        client_id="e2e-kafka-python",
        acks="all",
        retries=retries,
        retry_backoff_ms=50,
        reconnect_backoff_ms=50,
        linger_ms=5,
        # Small batches: the stream is many Produce requests long, so the
        # dropped acknowledgement is mid-stream.
        batch_size=2048,
        # E2E_TIMEOUT_MS: how long it waits for an answer before giving
        # up on a request (e2e's slow-broker runs).
        request_timeout_ms=int(os.environ.get("E2E_TIMEOUT_MS", "5000")),
        **sasl,
    )
    for i in range(n):
        f = p.send(topic, value=("r-%06d" % i).encode())
        f.add_callback(ok(i))
        f.add_errback(bad(i))
    p.flush(timeout=25)
    p.close(timeout=5)
    print(json.dumps({"version": "kafka-python " + kafka.__version__, "acked": acked, "failed": failed, "errors": errors}))


if __name__ == "__main__":
    main()
