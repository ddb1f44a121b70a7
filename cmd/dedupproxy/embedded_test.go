package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

// TestEmbeddedAutoCreate: the embedded cluster creates a topic on a
// Metadata request of every version that asks for it. Before v4 the
// request has no AllowAutoTopicCreation field and Kafka reads it as true
// (MetadataRequest.json: "default": "true"), which is how kafka-python
// 2.0.2 (Metadata v1) creates topics; from v4 the field decides.
func TestEmbeddedAutoCreate(t *testing.T) {
	c, err := startEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		version int16
		allow   bool
		created bool
	}{
		{0, false, true}, {1, false, true}, {3, false, true},
		{4, true, true}, {4, false, false}, {9, true, true}, {12, false, false},
	} {
		versions := kversion.Stable()
		versions.SetMaxKeyVersion(int16(kmsg.Metadata), tc.version)
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.MaxVersions(versions))
		if err != nil {
			t.Fatal(err)
		}
		topic := fmt.Sprintf("auto-v%d-%t", tc.version, tc.allow)
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		req.AllowAutoTopicCreation = tc.allow
		resp, err := req.RequestWith(ctx, cl)
		cl.Close()
		if err != nil {
			t.Fatalf("Metadata v%d: %v", tc.version, err)
		}
		if resp.Version != tc.version {
			t.Fatalf("sent Metadata v%d, want v%d", resp.Version, tc.version)
		}
		if len(resp.Topics) != 1 {
			t.Fatalf("Metadata v%d: %d topics in the answer", tc.version, len(resp.Topics))
		}
		got := resp.Topics[0]
		created := got.ErrorCode == 0 && len(got.Partitions) == 6
		if created != tc.created {
			t.Errorf("Metadata v%d allow=%t: error %v, %d partitions; want created=%t",
				tc.version, tc.allow, kerr.ErrorForCode(got.ErrorCode), len(got.Partitions), tc.created)
		}
	}
}

// TestEmbeddedAutoCreateKafkaPython: kafka-python, which sends Metadata
// v1, produces to a topic that does not exist yet, through the proxy in
// front of the embedded cluster (skipped where Debian's python3-kafka is
// not installed; e2e runs it as a client under test).
func TestEmbeddedAutoCreateKafkaPython(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import kafka").Run(); err != nil {
		testskip.Skipf(t, "kafka-python not installed (apt-get install python3-kafka): %v", err)
	}
	logs := newLogWatcher()
	ctx, cancel := context.WithCancel(context.Background())
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"--listen", "127.0.0.1:0", "--admin", "off"}, io.Discard, logs)
	}()
	defer func() {
		cancel()
		if code := <-exit; code != 0 {
			t.Errorf("exit %d", code)
		}
	}()
	addr := logs.await(t, `listener=bootstrap addr=(\S+)`)
	script := `import sys, kafka
p = kafka.KafkaProducer(bootstrap_servers=[sys.argv[1]], max_block_ms=10000)
print(p.send("created-by-kafka-python", b"hello").get(timeout=10))
p.close()`
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	out, err := exec.CommandContext(pctx, "/usr/bin/python3", "-c", script, addr).CombinedOutput()
	if err != nil {
		t.Fatalf("kafka-python: %v\n%s", err, out)
	}
}
