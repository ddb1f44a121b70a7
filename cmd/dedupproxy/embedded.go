package main

import (
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// startEmbedded starts the in-memory 3-broker cluster that serves when no
// upstream is configured, on free loopback ports.
func startEmbedded() (*kfake.Cluster, error) {
	return startLocalCluster([]int{0, 0, 0}, embeddedPartitions)
}

// embeddedPartitions is the partition count of a topic the embedded
// cluster creates on first use.
const embeddedPartitions = 6

// startLocalCluster starts an in-memory cluster on 127.0.0.1, one broker
// per port (0: a free one), for the embedded cluster and dedupproxy
// cluster. Every client can create a topic by producing to it, as on a
// broker with auto.create.topics.enable=true (Kafka's default).
//
// Metadata requests before v4 carry no AllowAutoTopicCreation field: Kafka
// reads them as allowing it (the field's default is true in
// MetadataRequest.json), but kfake decodes the missing field as false, so
// a client that speaks only v0-v3 (kafka-python 2.0.2 sends v1) could not
// create a topic. A control hook sets the field for those versions before
// kfake handles the request; it answers nothing itself.
func startLocalCluster(ports []int, partitions int) (*kfake.Cluster, error) {
	c, err := kfake.NewCluster(
		kfake.Ports(ports...),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(partitions),
	)
	if err != nil {
		return nil, err
	}
	c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if m, ok := req.(*kmsg.MetadataRequest); ok && m.Version < 4 {
			m.AllowAutoTopicCreation = true
		}
		return nil, nil, false
	})
	return c, nil
}
