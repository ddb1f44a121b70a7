// Heartbeat producer for e2e's TestHeartbeatsAcrossReconnect: kafkajs.
//
// usage: node beater.js BOOTSTRAP TOPIC CLIENT_ID
//
// Each line "beat" on stdin sends the record hb=ok to partition 0 of TOPIC
// (acks=-1, idempotent false) and prints "ok" once it is acknowledged, or
// "error: ..." if it failed: the test drives the beats by acknowledgements.
// At the end of stdin the producer disconnects and "closed" is printed.
'use strict'
const readline = require('readline')
const { Kafka, logLevel } = require('kafkajs')

async function main () {
  const [bootstrap, topic, clientId] = process.argv.slice(2)
  const kafka = new Kafka({
    clientId,
    brokers: bootstrap.split(','),
    logLevel: logLevel.NOTHING,
    connectionTimeout: 3000,
    requestTimeout: 10000,
    retry: { retries: 20, initialRetryTime: 50, maxRetryTime: 500 }
  })
  const producer = kafka.producer({ idempotent: false, allowAutoTopicCreation: false })
  await producer.connect()
  const lines = readline.createInterface({ input: process.stdin })
  for await (const line of lines) {
    if (line.trim() !== 'beat') continue
    try {
      await producer.send({ topic, acks: -1, messages: [{ value: 'hb=ok', partition: 0 }] })
      process.stdout.write('ok\n')
    } catch (e) {
      process.stdout.write('error: ' + String(e).replace(/\n/g, ' ') + '\n')
    }
  }
  await producer.disconnect()
  process.stdout.write('closed\n')
}

main().catch(e => { console.error(e); process.exit(1) })
