"""SASL_SSL producer for proxy/clients_tls_test.go: confluent-kafka-python (librdkafka).

usage: confluent_sasl_ssl.py BOOTSTRAP CA_FILE MECHANISM USER PASSWORD TOPIC N

Connects with security.protocol=SASL_SSL, verifying the proxy's certificate
against CA_FILE, and writes values 0 .. N-1 with idempotence on. Prints one
JSON line: {"version", "acked": count, "failed": count, "errors": [first
few], "auth_error": the first authentication error or null}. With a wrong
password it stops at the first authentication error instead of waiting for
the delivery timeout. Run with Debian's /usr/bin/python3
(python3-confluent-kafka).
"""
import json
import sys
import time

import confluent_kafka


def main():
    bootstrap, ca, mech, user, password, topic, n = sys.argv[1:8]
    n = int(n)
    acked, failed, errors = [0], [0], []
    auth_error = []

    def on_delivery(err, msg):
        if err is None:
            acked[0] += 1
            return
        failed[0] += 1
        if len(errors) < 5:
            errors.append(str(err))

    def on_error(err):
        # A broker answers bad credentials with SASL_AUTHENTICATION_FAILED
        # (librdkafka: _AUTHENTICATION); kfake closes the connection, which
        # librdkafka reports as a transport error during SASL.
        failed_auth = err.code() == confluent_kafka.KafkaError._AUTHENTICATION or "SASL authentication error" in err.str()
        if failed_auth and not auth_error:
            auth_error.append(str(err))
        elif len(errors) < 5:
            errors.append(str(err))

    p = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap,
        "client.id": "proxy-test-confluent-sasl-ssl",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": ca,
        "sasl.mechanisms": mech,
        "sasl.username": user,
        "sasl.password": password,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 25000,
        "error_cb": on_error,
    })
    for i in range(n):
        for _ in range(1000):  # bounded: wait for room in the local queue
            try:
                p.produce(topic, value=str(i).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    deadline = time.monotonic() + 28
    while len(p) > 0 and not auth_error and time.monotonic() < deadline:
        p.poll(0.05)
    version = "confluent-kafka %s (librdkafka %s)" % (confluent_kafka.version()[0], confluent_kafka.libversion()[0])
    print(json.dumps({"version": version, "acked": acked[0], "failed": failed[0], "undelivered": len(p),
                      "errors": errors, "auth_error": auth_error[0] if auth_error else None}))


if __name__ == "__main__":
    main()
