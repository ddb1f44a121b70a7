//go:build cgo

package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// confluentGoModule is the module whose version the results name.
const confluentGoModule = "github.com/confluentinc/confluent-kafka-go/v2"

// confluentGoClient: confluent-kafka-go, in the test process, on the
// librdkafka its module bundles (linked statically through cgo: no system
// library), idempotence off, acks=all. Without cgo it is not built and
// the client reports itself missing (clients_confluent_go_nocgo_test.go).
// paced: its records come from a live source (paceSource) and it lingers
// pacedLinger ms with pacedRetries retries, the settings librdkafka
// re-batches under.
func confluentGoClient(paced bool) legacyClient {
	c := legacyClient{
		name: "confluent-kafka-go", clientID: "e2e-confluent-go", retries: true, dropAt: 10,
		available: func() error {
			if _, v := kafka.LibraryVersion(); v == "" {
				return errors.New("confluent-kafka-go reports no librdkafka version")
			}
			return nil
		},
	}
	if paced {
		c.name, c.paced, c.dropAt = c.name+" paced", true, pacedDropEvery
	}
	c.produce = func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
		return confluentGoProduce(ctx, t, bootstrap, topic, o, paced)
	}
	return c
}

func confluentGoProduce(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts, paced bool) (produceResult, error) {
	n, auth := o.n, o.auth
	timeout := int64(5000)
	if o.timeout > 0 {
		timeout = o.timeout.Milliseconds()
	}
	cfg := kafka.ConfigMap{
		"bootstrap.servers":  bootstrap,
		"client.id":          "e2e-confluent-go",
		"enable.idempotence": false,
		"acks":               "all",
		"socket.timeout.ms":  int(timeout),
		"request.timeout.ms": int(timeout),
		"message.timeout.ms": 25000,
		// Its log goes to the test's log, not to stderr.
		"go.logs.channel.enable": true,
	}
	if paced {
		for k, v := range pacedConfig() {
			cfg[k] = v
		}
	} else {
		// As confluent-kafka-python: small batches, so the stream is many
		// Produce requests long and the dropped acknowledgement is
		// mid-stream.
		cfg["linger.ms"] = 5
		cfg["batch.num.messages"] = 100
		cfg["retry.backoff.ms"] = 50
		cfg["reconnect.backoff.ms"] = 50
	}
	if auth.Mechanism != "" {
		cfg["security.protocol"] = "SASL_PLAINTEXT"
		cfg["sasl.mechanisms"] = auth.Mechanism
		cfg["sasl.username"] = auth.User
		cfg["sasl.password"] = auth.Password
	}
	_, lib := kafka.LibraryVersion()
	version := fmt.Sprintf("confluent-kafka-go %s (librdkafka %s)", moduleVersion(confluentGoModule), lib)
	p, err := kafka.NewProducer(&cfg)
	if err != nil {
		return produceResult{}, err
	}
	// Its log and its events (errors) until Close closes their channels:
	// the first lines of each, for the test's log.
	var logs struct {
		sync.Mutex
		lines []string
	}
	note := func(s string) {
		logs.Lock()
		if len(logs.lines) < 20 {
			logs.lines = append(logs.lines, s)
		}
		logs.Unlock()
	}
	var drained sync.WaitGroup
	drained.Add(2)
	go func() {
		defer drained.Done()
		for ev := range p.Logs() {
			if ev.Level <= 4 { // warning and worse
				note(ev.String())
			}
		}
	}()
	go func() {
		defer drained.Done()
		for ev := range p.Events() {
			if e, ok := ev.(kafka.Error); ok {
				note(e.String())
			}
		}
	}()
	defer func() {
		p.Close()
		drained.Wait()
		if len(logs.lines) > 0 {
			t.Logf("confluent-kafka-go log:\n%s", strings.Join(logs.lines, "\n"))
		}
	}()

	// Room for every report: after a kill nobody reads them.
	deliveries := make(chan kafka.Event, n)
	var acks ackSet
	collected := make(chan error, 1)
	go func() {
		var err error
		for got := 0; got < n; got++ {
			select {
			case ev := <-deliveries:
				m, ok := ev.(*kafka.Message)
				if !ok {
					err = errors.Join(err, fmt.Errorf("delivery report %v", ev))
					continue
				}
				i, perr := indexOf(m.Value)
				err = errors.Join(err, perr)
				acks.done(i, m.TopicPartition.Error)
			case <-ctx.Done():
				collected <- fmt.Errorf("%d of %d deliveries reported: %w", got, n, ctx.Err())
				return
			}
		}
		collected <- err
	}()

	produce := func(i int) error {
		msg := &kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Value:          []byte(value(i)),
		}
		// A full local queue (100,000 messages by default: the replica
		// runs write more) makes room as deliveries complete; Flush waits
		// for them at most 50 ms at a time.
		for try := 0; ; try++ {
			err := p.Produce(msg, deliveries)
			var kerr kafka.Error
			if !errors.As(err, &kerr) || kerr.Code() != kafka.ErrQueueFull || try >= 1000 || ctx.Err() != nil {
				return err
			}
			p.Flush(50)
		}
	}
	if paced {
		err = paceSource(ctx, n, produce)
	} else {
		for i := 0; i < n && err == nil; i++ {
			err = produce(i)
		}
	}
	if err == nil {
		// Flush waits 100 ms at a time; the context bounds the whole.
		for i := 0; i < 600 && ctx.Err() == nil && p.Flush(100) > 0; i++ {
		}
		err = <-collected
	}
	if ctx.Err() != nil {
		// Killed (the abort mode): a dead process neither sends what it
		// queued nor reads the answers to what it sent.
		if perr := p.Purge(kafka.PurgeQueue | kafka.PurgeInFlight | kafka.PurgeNonBlocking); perr != nil {
			err = errors.Join(err, perr)
		}
		return acks.result(version), errors.Join(err, ctx.Err())
	}
	return acks.result(version), err
}

// confluentGoBeater: confluent-kafka-go, idempotence off, each beat to
// partition 0, awaited on its delivery report.
type confluentGoBeater struct {
	p     *kafka.Producer
	topic string
}

func openConfluentGoBeater(t *testing.T, e hbEnv) (beater, error) {
	bootstrap, topic, id := e.bootstrap, e.topic, e.id
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers": bootstrap, "client.id": id, "enable.idempotence": false, "acks": "all",
		"linger.ms": 0, "retry.backoff.ms": 50, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
		"message.timeout.ms": 25000, "go.logs.channel.enable": true,
	})
	if err != nil {
		return nil, err
	}
	go func() {
		for range p.Logs() { // its log is not the test's concern; drained so it never blocks
		}
	}()
	go func() {
		for range p.Events() {
		}
	}()
	return confluentGoBeater{p: p, topic: topic}, nil
}

func (b confluentGoBeater) beat() error {
	report := make(chan kafka.Event, 1)
	err := b.p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &b.topic, Partition: 0}, Value: []byte(heartbeatValue)}, report)
	if err != nil {
		return err
	}
	select {
	case ev := <-report:
		if m, ok := ev.(*kafka.Message); ok {
			return m.TopicPartition.Error
		}
		return fmt.Errorf("delivery report %v", ev)
	case <-time.After(30 * time.Second):
		return errors.New("no delivery report in 30 s")
	}
}

func (b confluentGoBeater) close() error {
	b.p.Flush(10000)
	b.p.Close()
	return nil
}
