package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/maphash"
	"io"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// defaultClusterPort is dedupproxy cluster's first broker port: away from
// the proxy's defaults (listen 9092, nodes from 9093, admin 9080) and from
// the ports the docs give replicas on one host (9192, 9292, ...).
const defaultClusterPort = 19092

// clusterFlags are dedupproxy cluster's flags.
type clusterFlags struct {
	fs                        *flag.FlagSet
	port, brokers, partitions *int
	timeOutOnce               *bool
}

func newClusterFlags() *clusterFlags {
	fs := flag.NewFlagSet("dedupproxy cluster", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &clusterFlags{
		fs:         fs,
		port:       fs.Int("port", defaultClusterPort, "broker 0 listens on 127.0.0.1:`PORT`, broker N on PORT+N; 0 takes free ports"),
		brokers:    fs.Int("brokers", 3, "how many brokers (`N`), with node ids 0..N-1"),
		partitions: fs.Int("partitions", embeddedPartitions, "partitions (`N`) of a topic created on first use"),
		timeOutOnce: fs.Bool("time-out-once", false, "store every Produce request's records, but answer its first send REQUEST_TIMED_OUT, "+
			"as a broker whose followers are slow does: the producer sends it again, and a cluster without the proxy stores it twice"),
	}
}

func (c *clusterFlags) usage(w io.Writer) {
	fmt.Fprint(w, `dedupproxy cluster: a local Kafka cluster for trying the proxy out.

Usage:
  dedupproxy cluster [--port PORT] [--brokers N] [--partitions N] [--time-out-once]

Runs an in-memory Kafka cluster on 127.0.0.1 (franz-go's kfake: the one the
proxy embeds when it has no upstream) and prints its bootstrap address.
Point the proxy, its replicas and dedupproxy audit at it as at a real cluster
(--upstream 127.0.0.1:19092) to try them on one machine. A topic is created
when a client first uses it. No TLS, no SASL; everything written is in memory
and lost on exit. It runs until SIGINT (Ctrl-C) or SIGTERM. With
--time-out-once its brokers lose the answer to every first send, so
producers retry: the fault the proxy exists for.

`)
	printFlags(w, c.fs, nil)
}

// runCluster is dedupproxy cluster. A port it cannot bind exits 2 (a
// configuration error, docs/operations.md "Exit codes").
func runCluster(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newClusterFlags()
	switch err := c.fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		c.usage(stdout)
		return 0
	case err != nil:
		return usageError(stderr, "dedupproxy cluster", flagError(c.fs, err))
	case c.fs.NArg() > 0:
		return usageError(stderr, "dedupproxy cluster", fmt.Errorf("unexpected argument %q", c.fs.Arg(0)))
	case *c.brokers < 1 || *c.brokers > 100:
		return usageError(stderr, "dedupproxy cluster", fmt.Errorf("--brokers %d: want 1..100", *c.brokers))
	case *c.partitions < 1:
		return usageError(stderr, "dedupproxy cluster", fmt.Errorf("--partitions %d: want at least 1", *c.partitions))
	case *c.port < 0 || *c.port > 0 && *c.port+*c.brokers-1 > 65535:
		return usageError(stderr, "dedupproxy cluster", fmt.Errorf("--port %d with %d brokers: ports outside 1..65535", *c.port, *c.brokers))
	}
	ports := make([]int, *c.brokers)
	for i := range ports {
		if *c.port != 0 {
			ports[i] = *c.port + i
		}
	}
	cluster, err := startLocalCluster(ports, *c.partitions)
	if err != nil {
		fmt.Fprintf(stderr, "dedupproxy cluster: %v (--port chooses other ports)\n", err)
		return 2
	}
	defer cluster.Close()
	if *c.timeOutOnce {
		timeOutFirstSends(cluster)
	}
	addrs := cluster.ListenAddrs()
	fmt.Fprintf(stdout, "dedupproxy cluster: %d in-memory Kafka brokers (franz-go kfake); everything written is lost on exit\n", len(addrs))
	fmt.Fprintf(stdout, "bootstrap %s\n", addrs[0])
	fmt.Fprintf(stdout, "brokers %s\n", strings.Join(addrs, ","))
	fmt.Fprintf(stdout, "try: dedupproxy --upstream %s\n", addrs[0])
	<-ctx.Done()
	fmt.Fprintln(stdout, "dedupproxy cluster: stopped")
	return 0
}

// timeOutFirstSends makes the cluster store every Produce request whose
// batches it has not seen before, and answer it REQUEST_TIMED_OUT, as Kafka
// answers when the followers do not acknowledge in time: the write is in
// the log, the producer is told it may not be, and sends it again. A
// request carrying any batch seen before (a resend: librdkafka, sarama,
// franz-go and the Java client resend the bytes they sent) is answered as
// usual, so every write ends acknowledged.
func timeOutFirstSends(c *kfake.Cluster) {
	seen := map[uint64]bool{}
	var order []uint64 // oldest first, to bound seen
	var last *kmsg.ProduceRequest
	var lastFirst bool
	first := func(req kmsg.Request) bool {
		pr, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return false
		}
		// Faults ask per partition; one request gets one answer.
		if pr == last {
			return lastFirst
		}
		var hashes []uint64
		fresh := true
		for _, t := range pr.Topics {
			for _, p := range t.Partitions {
				var h maphash.Hash
				h.SetSeed(hashSeed)
				h.WriteString(t.Topic)
				h.Write(t.TopicID[:])
				binary.Write(&h, binary.BigEndian, p.Partition)
				h.Write(p.Records)
				sum := h.Sum64()
				hashes = append(hashes, sum)
				fresh = fresh && !seen[sum]
			}
		}
		for _, sum := range hashes {
			if !seen[sum] {
				seen[sum] = true
				order = append(order, sum)
			}
		}
		for len(order) > 1<<16 {
			delete(seen, order[0])
			order = order[1:]
		}
		last, lastFirst = pr, fresh
		return fresh
	}
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: -1, When: first})
}

var hashSeed = maphash.MakeSeed()

// usageError prints a command-line mistake and the hint to the help, and
// returns exit code 2.
func usageError(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for its flags.\n", cmd, err, cmd)
	return 2
}
