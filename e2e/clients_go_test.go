package e2e

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The Go clients run in the test process, so they are always available.
func goAvailable() error { return nil }

// ackSet collects acknowledged indices from client callbacks.
type ackSet struct {
	mu     sync.Mutex
	acked  []int
	failed int
	errs   []string
}

func (a *ackSet) done(i int, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		a.acked = append(a.acked, i)
		return
	}
	a.failed++
	if len(a.errs) < 5 {
		a.errs = append(a.errs, err.Error())
	}
}

func (a *ackSet) result(version string) produceResult {
	a.mu.Lock()
	defer a.mu.Unlock()
	return produceResult{version: version, acked: a.acked, perValue: true, ackedCount: len(a.acked), failed: a.failed, errors: a.errs}
}

// indexOf parses value(i) back to i.
func indexOf(v []byte) (int, error) {
	s, ok := strings.CutPrefix(string(v), "r-")
	if !ok {
		return 0, fmt.Errorf("value %q is not one of ours", v)
	}
	return strconv.Atoi(s)
}

// franzClient: franz-go with idempotence disabled. Fast-retry knobs from
// docs/clients.md §2: without MetadataMinAge the retry after a dropped
// connection waits about 5 s. Small batches keep the stream many requests
// long, so the dropped acknowledgement is mid-stream.
func franzClient() legacyClient {
	return legacyClient{
		name: "franz-go", clientID: "e2e-franz-go", retries: true, dropAt: 10, available: goAvailable,
		produce: func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
			return franzProduce(ctx, bootstrap, topic, o, false)
		},
	}
}

func franzProduce(ctx context.Context, bootstrap, topic string, o produceOpts, idempotent bool) (produceResult, error) {
	// It gives up on a Produce request after its timeout plus the
	// overhead.
	timeout := 2 * time.Second
	if o.timeout > 0 {
		timeout = o.timeout
	}
	n, auth := o.n, o.auth
	opts := []kgo.Opt{
		kgo.SeedBrokers(bootstrap),
		kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ClientID("e2e-franz-go"),
		kgo.MetadataMinAge(200 * time.Millisecond),
		kgo.ProduceRequestTimeout(timeout / 2),
		kgo.RequestTimeoutOverhead(timeout / 2),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.ProducerBatchMaxBytes(2 << 10),
	}
	if !idempotent {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	if mech := kgoSASL(auth); mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return produceResult{}, err
	}
	defer cl.Close()
	var acks ackSet
	for i := 0; i < n; i++ {
		i := i
		cl.Produce(ctx, &kgo.Record{Value: []byte(value(i))}, func(_ *kgo.Record, err error) { acks.done(i, err) })
	}
	if err := cl.Flush(ctx); err != nil {
		return acks.result("franz-go " + moduleVersion("github.com/twmb/franz-go")), fmt.Errorf("flush: %w", err)
	}
	return acks.result("franz-go " + moduleVersion("github.com/twmb/franz-go")), nil
}

// franzIdempotentClient: franz-go with idempotence on (its default), the
// same knobs as franzClient. Its retry carries the original's producer id
// and sequence, so the proxy's idempotent path answers it (docs/produce-path.md)
// or the broker does; the row shows the proxy never breaks that.
func franzIdempotentClient() legacyClient {
	c := franzClient()
	c.name, c.idempotent = "franz-go idempotent", true
	c.produce = func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
		return franzProduce(ctx, bootstrap, topic, o, true)
	}
	return c
}

// saramaClient: sarama's async producer, idempotence off (its default).
// Flush.Frequency lingers 20 ms so batches hold many records; with one
// record per batch the retried batch is a single record (docs/clients.md §3:
// +2 then, +1798 with a 20 ms linger on 10,000).
func saramaClient() legacyClient {
	return legacyClient{
		// sarama stamps a record without a timestamp of its own each time
		// it adds it to a batch, a retry included (produceSet.add). In
		// flight: 5 requests (Net.MaxOpenRequests) of at most 100 records
		// (Flush.MaxMessages).
		name: "sarama", clientID: "e2e-sarama", retries: true, restampsResends: true, dropAt: 10,
		inFlight: 500, recordsPerRequest: 100, available: goAvailable,
		produce: func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
			n := o.n
			cfg := sarama.NewConfig()
			cfg.ClientID = "e2e-sarama"
			cfg.Producer.RequiredAcks = sarama.WaitForAll
			cfg.Producer.Idempotent = false
			cfg.Producer.Return.Successes = true
			cfg.Producer.Return.Errors = true
			cfg.Producer.Flush.Frequency = 5 * time.Millisecond
			cfg.Producer.Flush.MaxMessages = 100
			cfg.Producer.Retry.Max = 5
			saramaSASL(cfg, o.auth)
			cfg.Producer.Retry.Backoff = 50 * time.Millisecond
			cfg.Metadata.Retry.Backoff = 50 * time.Millisecond
			cfg.Net.DialTimeout = 5 * time.Second
			cfg.Net.ReadTimeout = 5 * time.Second
			cfg.Net.WriteTimeout = 5 * time.Second
			if o.timeout > 0 {
				// A read that times out fails every request in flight
				// on the connection, which sarama closes; it retries
				// their records on a new one.
				cfg.Net.ReadTimeout = o.timeout
				cfg.Producer.Retry.Max = 10
			}
			p, err := sarama.NewAsyncProducer([]string{bootstrap}, cfg)
			if err != nil {
				return produceResult{}, err
			}
			var acks ackSet
			collected := make(chan error, 1)
			go func() {
				var err error
				for got := 0; got < n; got++ {
					select {
					case m := <-p.Successes():
						i, perr := indexOf(mustBytes(m.Value))
						err = errors.Join(err, perr)
						acks.done(i, nil)
					case pe := <-p.Errors():
						i, perr := indexOf(mustBytes(pe.Msg.Value))
						err = errors.Join(err, perr)
						acks.done(i, pe.Err)
					case <-ctx.Done():
						collected <- fmt.Errorf("%d of %d deliveries reported: %w", got, n, ctx.Err())
						return
					}
				}
				collected <- err
			}()
			for i := 0; i < n; i++ {
				select {
				case p.Input() <- &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(value(i))}:
				case <-ctx.Done():
				}
			}
			err = <-collected
			p.AsyncClose()
			// AsyncClose closes both channels once every message is
			// settled; both are drained at once, or a full one blocks it
			// (a killed run fails thousands of messages).
			errorsDrained := make(chan struct{})
			go func() {
				defer close(errorsDrained)
				for range p.Errors() {
				}
			}()
			for range p.Successes() {
			}
			<-errorsDrained
			if err != nil {
				return acks.result("sarama " + moduleVersion("github.com/IBM/sarama")), err
			}
			return acks.result("sarama " + moduleVersion("github.com/IBM/sarama")), nil
		},
	}
}

func mustBytes(e sarama.Encoder) []byte {
	b, err := e.Encode()
	if err != nil {
		return nil
	}
	return b
}

// kafkaGoClient: segmentio/kafka-go's Writer with RequiredAcks RequireAll
// (its default is acks=0). It is never idempotent. One WriteMessages call
// with every message; the Writer retries inside it (MaxAttempts) and
// returns per-message errors as WriteErrors.
func kafkaGoClient() legacyClient {
	return legacyClient{
		// In flight: a batch of at most 100 records (BatchSize) to each
		// of the 3 partitions.
		name: "kafka-go", clientID: "e2e-kafka-go", retries: true, restampsResends: true, dropAt: 10,
		inFlight: 3 * 100, recordsPerRequest: 100, available: goAvailable,
		produce: func(ctx context.Context, t *testing.T, bootstrap, topic string, o produceOpts) (produceResult, error) {
			n, timeout := o.n, 5*time.Second
			if o.timeout > 0 {
				// A Produce request's deadline (its context's, and so its
				// connection's): past it the Writer closes the
				// connection and retries the batch.
				timeout = o.timeout
			}
			w := &kafkago.Writer{
				Addr:            kafkago.TCP(bootstrap),
				Topic:           topic,
				RequiredAcks:    kafkago.RequireAll,
				Balancer:        &kafkago.RoundRobin{},
				BatchSize:       100,
				BatchTimeout:    5 * time.Millisecond,
				MaxAttempts:     10,
				WriteBackoffMin: 50 * time.Millisecond,
				WriteBackoffMax: 500 * time.Millisecond,
				ReadTimeout:     timeout,
				WriteTimeout:    timeout,
				Transport:       &kafkago.Transport{ClientID: "e2e-kafka-go", MetadataTTL: time.Second, DialTimeout: 5 * time.Second, SASL: kafkaGoSASL(o.auth)},
			}
			defer func() {
				if ctx.Err() != nil {
					// Killed (the abort mode): Close would retry what is
					// in flight for half a minute; a dead process does not.
					go w.Close()
					return
				}
				w.Close()
			}()
			msgs := make([]kafkago.Message, n)
			for i := range msgs {
				msgs[i].Value = []byte(value(i))
			}
			err := w.WriteMessages(ctx, msgs...)
			var acks ackSet
			var werrs kafkago.WriteErrors
			switch {
			case err == nil:
				for i := range msgs {
					acks.done(i, nil)
				}
			case errors.As(err, &werrs) && len(werrs) == n:
				for i, e := range werrs {
					acks.done(i, e)
				}
			default:
				return produceResult{}, err
			}
			return acks.result("kafka-go " + moduleVersion("github.com/segmentio/kafka-go")), nil
		},
	}
}
