package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// defaultClusterPort is dedupproxy cluster's first broker port: away from
// the proxy's defaults (listen 9092, nodes from 9093, admin 9080) and from
// the ports the docs give replicas on one host (9192, 9292, ...).
const defaultClusterPort = 19092

// clusterFlags are dedupproxy cluster's flags.
type clusterFlags struct {
	fs                        *flag.FlagSet
	port, brokers, partitions *int
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
	}
}

func (c *clusterFlags) usage(w io.Writer) {
	fmt.Fprint(w, `dedupproxy cluster: a local Kafka cluster for trying the proxy out.

Usage:
  dedupproxy cluster [--port PORT] [--brokers N] [--partitions N]

Runs an in-memory Kafka cluster on 127.0.0.1 (franz-go's kfake: the one the
proxy embeds when it has no upstream) and prints its bootstrap address.
Point the proxy, its replicas and dedupproxy audit at it as at a real cluster
(--upstream 127.0.0.1:19092) to try them on one machine. A topic is created
when a client first uses it. No TLS, no SASL; everything written is in memory
and lost on exit. It runs until SIGINT (Ctrl-C) or SIGTERM.

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
	addrs := cluster.ListenAddrs()
	fmt.Fprintf(stdout, "dedupproxy cluster: %d in-memory Kafka brokers (franz-go kfake); everything written is lost on exit\n", len(addrs))
	fmt.Fprintf(stdout, "bootstrap %s\n", addrs[0])
	fmt.Fprintf(stdout, "brokers %s\n", strings.Join(addrs, ","))
	fmt.Fprintf(stdout, "try: dedupproxy --upstream %s\n", addrs[0])
	<-ctx.Done()
	fmt.Fprintln(stdout, "dedupproxy cluster: stopped")
	return 0
}

// usageError prints a command-line mistake and the hint to the help, and
// returns exit code 2.
func usageError(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for its flags.\n", cmd, err, cmd)
	return 2
}
