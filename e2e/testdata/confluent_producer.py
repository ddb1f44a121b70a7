"""Legacy producer for e2e/legacy_test.go: confluent-kafka-python (librdkafka).

usage: confluent_producer.py BOOTSTRAP TOPIC N [BURST EVERY_MS CONFIG]

Writes values r-000000 .. r-{N-1} with acks=all and idempotence off, then
prints one JSON line: {"version", "acked": [indices], "failed": [indices],
"errors": [first few]}. Run with Debian's /usr/bin/python3 (python3-confluent-kafka).

With BURST and EVERY_MS the values come as from a live source: BURST of them
every EVERY_MS, and CONFIG (a JSON object) is added to the producer's
configuration (e2e's paced rows). E2E_TIMEOUT_MS, when set, is its request
timeout (5000 ms otherwise).
"""
import json
import os
import sys
import time

import confluent_kafka


def main():
    bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    paced = len(sys.argv) > 4
    acked, failed, errors = [], [], []
    # E2E_TIMEOUT_MS: how long it waits for an answer before giving up on
    # a request (e2e's slow-broker runs).
    timeout = int(os.environ.get("E2E_TIMEOUT_MS", "5000"))

    def on_delivery(err, msg):
        i = int(msg.value().decode()[2:])
        if err is None:
            acked.append(i)
            return
        failed.append(i)
        if len(errors) < 5:
            errors.append(str(err))

    conf = {
        "bootstrap.servers": bootstrap,
        "client.id": "e2e-confluent-python",
        "enable.idempotence": False,
        "acks": "all",
        "socket.timeout.ms": timeout,
        "request.timeout.ms": timeout,
        "message.timeout.ms": 25000,
    }
    if paced:
        burst, every = int(sys.argv[4]), int(sys.argv[5]) / 1000.0
        conf.update(json.loads(sys.argv[6]))
    else:
        conf.update({
            "linger.ms": 5,
            # Small batches: the stream is many Produce requests long, so
            # the dropped acknowledgement is mid-stream.
            "batch.num.messages": 100,
            "retry.backoff.ms": 50,
            "reconnect.backoff.ms": 50,
        })
    # A real cluster with SASL (e2e: DEDUPPROXY_TEST_SASL_*), through the proxy.
    if os.environ.get("E2E_SASL_MECHANISM"):
        conf.update({
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": os.environ["E2E_SASL_MECHANISM"],
            "sasl.username": os.environ["E2E_SASL_USER"],
            "sasl.password": os.environ["E2E_SASL_PASSWORD"],
        })
    p = confluent_kafka.Producer(conf)
    start = time.monotonic()
    for i in range(n):
        if paced and i > 0 and i % burst == 0:
            # The next burst is due: serve delivery reports meanwhile.
            due = start + (i // burst) * every
            while time.monotonic() < due:
                p.poll(max(0.0, due - time.monotonic()))
        v = "r-%06d" % i
        for _ in range(1000):  # bounded: wait for room in the local queue
            try:
                p.produce(topic, value=v.encode(), on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(28)
    version = "confluent-kafka %s (librdkafka %s)" % (confluent_kafka.version()[0], confluent_kafka.libversion()[0])
    print(json.dumps({"version": version, "acked": acked, "failed": failed, "undelivered": left, "errors": errors}))


if __name__ == "__main__":
    main()
