"""Heartbeat producer for e2e's TestHeartbeatsAcrossReconnect.

usage: beater.py CLIENT BOOTSTRAP TOPIC CLIENT_ID

CLIENT is confluent (confluent-kafka-python, librdkafka) or kafka-python.
Each line "beat" on stdin sends the record hb=ok to partition 0 of TOPIC
(acks=all, idempotence off) and prints "ok" once it is acknowledged, or
"error: ..." if it failed: the test drives the beats by acknowledgements.
At the end of stdin the producer is closed and "closed" printed. Run with
Debian's /usr/bin/python3.
"""
import sys


def main():
    client, bootstrap, topic, client_id = sys.argv[1:5]
    if client == "confluent":
        import confluent_kafka
        p = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "enable.idempotence": False,
            "acks": "all",
            "linger.ms": 0,
            "retry.backoff.ms": 50,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "message.timeout.ms": 25000,
        })

        def beat():
            result = []
            p.produce(topic, value=b"hb=ok", partition=0, on_delivery=lambda err, msg: result.append(err))
            if p.flush(25) > 0 or not result:
                return "no delivery report within 25 s"
            return None if result[0] is None else str(result[0])

        def close():
            p.flush(25)
    else:
        import kafka
        p = kafka.KafkaProducer(bootstrap_servers=bootstrap.split(","), client_id=client_id, acks="all",
                                retries=10, retry_backoff_ms=50, reconnect_backoff_ms=50,
                                reconnect_backoff_max_ms=500, linger_ms=0)

        def beat():
            try:
                p.send(topic, value=b"hb=ok", partition=0).get(timeout=25)
            except Exception as e:  # reported to the test, which fails on it
                return repr(e)
            return None

        def close():
            p.close(timeout=10)

    for line in sys.stdin:
        if line.strip() != "beat":
            continue
        err = beat()
        print("ok" if err is None else "error: " + err, flush=True)
    close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
