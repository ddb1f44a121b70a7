package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The heartbeat clients of TestHeartbeatsAcrossReconnect: one client
// instance each, sending the record hb=ok to partition 0 of a topic, with
// acks=all and idempotence off, one beat at a time.

// heartbeatValue is every beat's value: identical records, told apart (if
// at all) by their timestamps.
const heartbeatValue = "hb=ok"

// beater is one client instance sending heartbeats.
type beater interface {
	// beat sends one heartbeat and returns once the client reports it
	// acknowledged, or failed.
	beat() error
	// close closes the client as its application would at its end.
	close() error
}

// hbClient is a client of the heartbeat runs.
type hbClient struct {
	name string
	// restamps: the client stamps a resend anew, so the proxy compares its
	// records by content only (docs/legacy.md, "What a record is").
	restamps  bool
	available func() error
	// open starts an instance as e says.
	open func(t *testing.T, e hbEnv) (beater, error)
	// onePass: one instance sends its beats in one pass, acknowledged
	// when it closes (kcat reads its input to the end first): each side
	// of a reconnect is a new instance with the same client id.
	onePass bool
}

// hbEnv is where a heartbeat client runs.
type hbEnv struct {
	bootstrap string // one address or several, comma-separated
	topic, id string // its topic and client id
	// logged counts the records partition 0 holds, read straight from
	// the cluster.
	logged func() int64
}

// heartbeatClients are the clients of the heartbeat runs: every client of
// the matrix, and a raw one.
func heartbeatClients() []hbClient {
	python := func(client string) func(t *testing.T, e hbEnv) (beater, error) {
		return func(t *testing.T, e hbEnv) (beater, error) {
			return startLineBeater(t, debianPython, filepath.Join("testdata", "beater.py"), client, e.bootstrap, e.topic, e.id)
		}
	}
	return []hbClient{
		{name: "raw", available: goAvailable, open: openRawBeater},
		{name: "franz-go", available: goAvailable, open: openFranzBeater},
		{name: "sarama", restamps: true, available: goAvailable, open: openSaramaBeater},
		{name: "kafka-go", restamps: true, available: goAvailable, open: openKafkaGoBeater},
		{name: "kcat", available: kcatClient(false).available, open: openKcatBeater, onePass: true},
		{name: "confluent-kafka-python", available: pythonModule("confluent_kafka"), open: python("confluent")},
		{name: "confluent-kafka-go", available: confluentGoClient(false).available, open: openConfluentGoBeater},
		{name: "kafka-python", available: pythonModule("kafka"), open: python("kafka-python")},
		{name: "kafkajs", restamps: true, available: kafkajsClient().available,
			open: func(t *testing.T, e hbEnv) (beater, error) {
				return startLineBeater(t, "node", filepath.Join("testdata", "beater.js"), e.bootstrap, e.topic, e.id)
			}},
		{name: "@platformatic/kafka", restamps: true, available: platformaticAvailable},
	}
}

// platformaticAvailable: @platformatic/kafka runs only where it is
// installed in e2e/node_modules (it is not among e2e/package.json's), and
// no beater drives it yet.
func platformaticAvailable() error {
	if _, err := os.Stat(filepath.Join("node_modules", "@platformatic", "kafka", "package.json")); err != nil {
		return fmt.Errorf("@platformatic/kafka is not installed in e2e/node_modules: %w", err)
	}
	return errors.New("@platformatic/kafka is installed, but no heartbeat driver is written for it")
}

// hbRecord is a heartbeat record for partition 0 of topic.
func hbRecord(topic string) *kgo.Record {
	return &kgo.Record{Topic: topic, Partition: 0, Value: []byte(heartbeatValue)}
}

// franzBeater: franz-go, idempotence off, the partition chosen by the record.
type franzBeater struct{ cl *kgo.Client }

func openFranzBeater(t *testing.T, e hbEnv) (beater, error) {
	bootstrap, topic, id := e.bootstrap, e.topic, e.id
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(bootstrap, ",")...), kgo.ClientID(id), kgo.DisableIdempotentWrite(),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0),
		kgo.MetadataMinAge(100*time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.DefaultProduceTopic(topic))
	if err != nil {
		return nil, err
	}
	return franzBeater{cl}, nil
}

func (b franzBeater) beat() error {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	return b.cl.ProduceSync(ctx, hbRecord("")).FirstErr()
}

func (b franzBeater) close() error { b.cl.Close(); return nil }

// saramaBeater: sarama's SyncProducer, idempotence off (its default), to
// partition 0; the producer stamps each record (anew on a resend).
type saramaBeater struct {
	p     sarama.SyncProducer
	topic string
}

func openSaramaBeater(t *testing.T, e hbEnv) (beater, error) {
	bootstrap, topic, id := e.bootstrap, e.topic, e.id
	cfg := sarama.NewConfig()
	cfg.ClientID = id
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Retry.Max = 20
	cfg.Producer.Retry.Backoff = 50 * time.Millisecond
	cfg.Metadata.Retry.Backoff = 50 * time.Millisecond
	p, err := sarama.NewSyncProducer(strings.Split(bootstrap, ","), cfg)
	if err != nil {
		return nil, err
	}
	return saramaBeater{p: p, topic: topic}, nil
}

func (b saramaBeater) beat() error {
	_, _, err := b.p.SendMessage(&sarama.ProducerMessage{Topic: b.topic, Partition: 0, Value: sarama.StringEncoder(heartbeatValue)})
	return err
}

func (b saramaBeater) close() error { return b.p.Close() }

// kafkaGoBeater: kafka-go's Writer, one message a write, Message.Time
// unset (the Writer stamps it, and anew on a resend).
type kafkaGoBeater struct {
	w         *kafkago.Writer
	transport *kafkago.Transport
}

// partitionZero is a kafka-go Balancer that always picks partition 0.
type partitionZero struct{}

func (partitionZero) Balance(kafkago.Message, ...int) int { return 0 }

func openKafkaGoBeater(t *testing.T, e hbEnv) (beater, error) {
	bootstrap, topic, id := e.bootstrap, e.topic, e.id
	tr := &kafkago.Transport{ClientID: id, MetadataTTL: 200 * time.Millisecond, DialTimeout: 5 * time.Second}
	w := &kafkago.Writer{
		Addr:            kafkago.TCP(strings.Split(bootstrap, ",")...),
		Topic:           topic,
		RequiredAcks:    kafkago.RequireAll,
		Balancer:        partitionZero{},
		BatchSize:       1,
		BatchTimeout:    time.Millisecond,
		MaxAttempts:     20,
		WriteBackoffMin: 50 * time.Millisecond,
		WriteBackoffMax: 500 * time.Millisecond,
		Transport:       tr,
	}
	return kafkaGoBeater{w: w, transport: tr}, nil
}

func (b kafkaGoBeater) beat() error {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	return b.w.WriteMessages(ctx, kafkago.Message{Value: []byte(heartbeatValue)})
}

// close closes the Writer and its Transport's pooled connections, as an
// application at its end does (its process exits).
func (b kafkaGoBeater) close() error {
	err := b.w.Close()
	b.transport.CloseIdleConnections()
	return err
}

// rawBeater: a hand-written client naming no software, stamping each beat
// with the time it is sent, and resending it as it was on a new
// connection when its connection fails or its broker no longer leads.
type rawBeater struct {
	bootstrap []string
	topic, id string
	conn      net.Conn
	corr      int32
}

func openRawBeater(t *testing.T, e hbEnv) (beater, error) {
	bootstrap, topic, id := e.bootstrap, e.topic, e.id
	return &rawBeater{bootstrap: strings.Split(bootstrap, ","), topic: topic, id: id}, nil
}

// rawRequest sends req on c and reads its response.
func rawRequest(c net.Conn, req kmsg.Request, id string, corr int32) (kmsg.Response, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	frame := kmsg.NewRequestFormatter(kmsg.FormatterClientID(id)).AppendRequest(nil, req, corr)
	if _, err := c.Write(frame); err != nil {
		return nil, err
	}
	body, err := readFrame(c)
	if err != nil {
		return nil, err
	}
	body = body[4:] // the size
	resp := req.ResponseKind()
	off := 4 // the correlation id
	if resp.IsFlexible() {
		off++ // the response header's empty tags
	}
	if len(body) < off {
		return nil, io.ErrUnexpectedEOF
	}
	return resp, resp.ReadFrom(body[off:])
}

// leaderConn asks a bootstrap address for partition 0's leader and
// connects to it.
func (b *rawBeater) leaderConn() (net.Conn, error) {
	var errs error
	for _, addr := range b.bootstrap {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(9)
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(b.topic)
		req.Topics = append(req.Topics, rt)
		b.corr++
		resp, err := rawRequest(c, req, b.id, b.corr)
		c.Close()
		if err != nil {
			errs = errors.Join(errs, err)
			continue
		}
		md := resp.(*kmsg.MetadataResponse)
		leader := int32(-1)
		for _, tp := range md.Topics {
			for _, p := range tp.Partitions {
				if p.Partition == 0 && p.ErrorCode == 0 {
					leader = p.Leader
				}
			}
		}
		for _, br := range md.Brokers {
			if br.NodeID == leader {
				return net.DialTimeout("tcp", net.JoinHostPort(br.Host, fmt.Sprint(br.Port)), 5*time.Second)
			}
		}
		errs = errors.Join(errs, fmt.Errorf("%s: no leader for partition 0 of %s", addr, b.topic))
	}
	return nil, errs
}

func (b *rawBeater) beat() error {
	ts := time.Now().UnixMilli()
	// One record: attributes, timestamp and offset deltas 0, no key, the
	// value, no headers; length-prefixed.
	rec := []byte{0, 0, 0, 1} // attributes, timestamp delta, offset delta, key length -1 (varints)
	rec = binary.AppendVarint(rec, int64(len(heartbeatValue)))
	rec = append(rec, heartbeatValue...)
	rec = binary.AppendVarint(rec, 0)
	recs := append(binary.AppendVarint(nil, int64(len(rec))), rec...)
	batch := kmsg.RecordBatch{Magic: 2, ProducerID: -1, ProducerEpoch: -1, FirstSequence: -1, NumRecords: 1,
		FirstTimestamp: ts, MaxTimestamp: ts, Records: recs}
	raw := batch.AppendTo(nil)
	binary.BigEndian.PutUint32(raw[8:], uint32(len(raw)-12))                                          // the batch length
	binary.BigEndian.PutUint32(raw[17:], crc32.Checksum(raw[21:], crc32.MakeTable(crc32.Castagnoli))) // its CRC-32C
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(9)
	req.Acks, req.TimeoutMillis = -1, 5000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = b.topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Partition, pp.Records = 0, raw
	pt.Partitions = append(pt.Partitions, pp)
	req.Topics = append(req.Topics, pt)
	var errs error
	// Bounded: a proxy restarting or a node moving between replicas is
	// back within a few attempts; the backoff is the client's own.
	for attempt := 0; attempt < 100; attempt++ {
		if attempt > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		if b.conn == nil {
			c, err := b.leaderConn()
			if err != nil {
				errs = err
				continue
			}
			b.conn = c
		}
		b.corr++
		resp, err := rawRequest(b.conn, req, b.id, b.corr)
		if err != nil {
			b.conn.Close()
			b.conn, errs = nil, err
			continue
		}
		code := resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode
		if code == 0 {
			return nil
		}
		// NOT_LEADER_OR_FOLLOWER and the like: ask where the partition
		// is now, and send it there.
		b.conn.Close()
		b.conn, errs = nil, fmt.Errorf("produce: error code %d", code)
	}
	return errs
}

func (b *rawBeater) close() error {
	if b.conn != nil {
		return b.conn.Close()
	}
	return nil
}

// lineBeater drives a child program that sends a heartbeat for each line
// "beat" on its stdin and answers "ok" or "error: ..." once it has its
// acknowledgement (testdata/beater.py, beater.js), or, for kcat, whose
// delivery reports are on stderr, once that reports the record delivered.
type lineBeater struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string // what answers a beat: "ok" or "error: ..."
	other   chan string // everything else the child prints, for the log
	done    chan error
	t       *testing.T
	beatTxt string // what one beat writes to stdin
}

// startLineBeater runs name with args, answering beats on stdout.
func startLineBeater(t *testing.T, name string, args ...string) (beater, error) {
	return startBeaterProcess(t, "beat\n", false, name, args...)
}

func startBeaterProcess(t *testing.T, beatTxt string, kcat bool, name string, args ...string) (beater, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "KAFKAJS_NO_PARTITIONER_WARNING=1", "PYTHONUNBUFFERED=1")
	cmd.WaitDelay = 2 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &lineBeater{cmd: cmd, stdin: stdin, lines: make(chan string, 1024), other: make(chan string, 1024), done: make(chan error, 1), t: t, beatTxt: beatTxt}
	var readers sync.WaitGroup
	readers.Add(2)
	read := func(r io.Reader, answers bool) {
		defer readers.Done()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case answers && (line == "ok" || strings.HasPrefix(line, "error: ")):
				b.lines <- line
			case kcat && strings.Contains(line, "Message delivered"):
				b.lines <- "ok"
			case kcat && strings.Contains(line, "Delivery failed"):
				b.lines <- "error: " + line
			default:
				select {
				case b.other <- line:
				default:
				}
			}
		}
	}
	go read(stdout, !kcat)
	go read(stderr, false)
	go func() {
		readers.Wait()
		b.done <- cmd.Wait()
		close(b.lines)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	return b, nil
}

func (b *lineBeater) beat() error {
	if _, err := io.WriteString(b.stdin, b.beatTxt); err != nil {
		return fmt.Errorf("%s: %w (%s)", b.cmd.Path, err, b.drained())
	}
	select {
	case line, ok := <-b.lines:
		switch {
		case !ok:
			return fmt.Errorf("%s exited (%s)", b.cmd.Path, b.drained())
		case line != "ok":
			return errors.New(line)
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s: no acknowledgement in 30 s (%s)", b.cmd.Path, b.drained())
	}
}

// drained is what the child printed besides its answers, for an error.
func (b *lineBeater) drained() string {
	var out []string
	for {
		select {
		case l := <-b.other:
			if len(out) < 20 {
				out = append(out, l)
			}
		default:
			return strings.Join(out, "; ")
		}
	}
}

func (b *lineBeater) close() error {
	b.stdin.Close()
	select {
	case err := <-b.done:
		if err != nil {
			return fmt.Errorf("%s: %w (%s)", b.cmd.Path, err, b.drained())
		}
		return nil
	case <-time.After(30 * time.Second):
		b.cmd.Process.Kill()
		return fmt.Errorf("%s did not exit within 30 s of the end of its input (%s)", b.cmd.Path, b.drained())
	}
}

// kcatBeater: kcat producing each line of its stdin to partition 0. kcat
// reads its input to its end before it sends a record (a pipe's lines sit
// in its input buffer), so one kcat run is one burst of beats pipelined on
// one connection, sent when the run's input ends: close. Its delivery
// reports (-v -v -v) say how many were acknowledged.
type kcatBeater struct {
	*lineBeater
	sent int
}

func openKcatBeater(t *testing.T, e hbEnv) (beater, error) {
	b, err := startBeaterProcess(t, heartbeatValue+"\n", true, "kcat", "-P", "-E", "-v", "-v", "-v", "-b", e.bootstrap, "-t", e.topic, "-p", "0",
		"-X", "client.id="+e.id, "-X", "enable.idempotence=false", "-X", "acks=all", "-X", "linger.ms=0",
		"-X", "retry.backoff.ms=50", "-X", "reconnect.backoff.ms=50", "-X", "reconnect.backoff.max.ms=500", "-X", "message.timeout.ms=25000")
	if err != nil {
		return nil, err
	}
	return &kcatBeater{lineBeater: b.(*lineBeater)}, nil
}

// beat adds a line to kcat's input; close sends them all.
func (b *kcatBeater) beat() error {
	if _, err := io.WriteString(b.stdin, b.beatTxt); err != nil {
		return fmt.Errorf("kcat: %w (%s)", err, b.drained())
	}
	b.sent++
	return nil
}

// close ends kcat's input, waits for it to deliver every line and exit,
// and fails unless each was acknowledged.
func (b *kcatBeater) close() error {
	if err := b.lineBeater.close(); err != nil {
		return err
	}
	acked, failed := 0, 0
	for line := range b.lines {
		if line == "ok" {
			acked++
		} else {
			failed++
		}
	}
	if acked != b.sent {
		return fmt.Errorf("kcat acknowledged %d of %d beats (%d failed; %s)", acked, b.sent, failed, b.drained())
	}
	return nil
}
