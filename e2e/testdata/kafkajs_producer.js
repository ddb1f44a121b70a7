// Legacy producer for e2e/legacy_test.go: kafkajs (e2e/package.json).
//
// usage: node kafkajs_producer.js BOOTSTRAP TOPIC N
//
// Writes values r-000000 .. r-{N-1} with acks=-1 and idempotent false, in
// sends of 100 messages one after another (each send is one Produce request
// to the single broker), then prints one JSON line: {"version", "acked":
// [indices], "failed": [indices], "errors": [first few]}.
'use strict'
const { Kafka, logLevel } = require('kafkajs')
const version = require('kafkajs/package.json').version

const perSend = 100

async function main () {
  const [bootstrap, topic, nArg] = process.argv.slice(2)
  const n = parseInt(nArg, 10)
  const kafka = new Kafka({
    clientId: 'e2e-kafkajs',
    brokers: [bootstrap],
    logLevel: logLevel.NOTHING,
    connectionTimeout: 3000,
    // E2E_TIMEOUT_MS: how long it waits for an answer before giving up on
    // a request (e2e's slow-broker runs).
    requestTimeout: parseInt(process.env.E2E_TIMEOUT_MS || '5000', 10),
    retry: { retries: 5, initialRetryTime: 50, maxRetryTime: 1000 },
    // A real cluster with SASL (e2e: DEDUPPROXY_TEST_SASL_*), through the proxy.
    sasl: process.env.E2E_SASL_MECHANISM
      ? { mechanism: process.env.E2E_SASL_MECHANISM.toLowerCase(), username: process.env.E2E_SASL_USER, password: process.env.E2E_SASL_PASSWORD }
      : undefined
  })
  const producer = kafka.producer({ idempotent: false, allowAutoTopicCreation: false })
  await producer.connect()
  const acked = []
  const failed = []
  const errors = []
  for (let start = 0; start < n; start += perSend) {
    const idx = []
    const messages = []
    for (let i = start; i < Math.min(n, start + perSend); i++) {
      idx.push(i)
      messages.push({ value: 'r-' + String(i).padStart(6, '0') })
    }
    try {
      await producer.send({ topic, acks: -1, messages })
      acked.push(...idx)
    } catch (e) {
      failed.push(...idx)
      if (errors.length < 5) errors.push(String(e))
    }
  }
  await producer.disconnect()
  process.stdout.write(JSON.stringify({ version: 'kafkajs ' + version, acked, failed, errors }) + '\n')
}

main().catch(e => { console.error(e); process.exit(1) })
