// Package testfetch builds Fetch responses for the tests of the packages
// that relay them (relay, proxy). Nothing here is for production.
package testfetch

import "github.com/twmb/franz-go/pkg/kmsg"

// Body encodes a Fetch response body (after the header) of version
// v: partition 0 carries recordsLen bytes of made-up record batches
// (kmsg keeps them as bytes), partition 1 none; with nodes (v16+) it
// carries KIP-951 NodeEndpoints naming the real broker, as a broker does
// beside NOT_LEADER_OR_FOLLOWER.
func Body(v int16, recordsLen int, nodes ...kmsg.FetchResponseBroker) []byte {
	resp := kmsg.NewPtrFetchResponse()
	resp.SetVersion(v)
	t := kmsg.NewFetchResponseTopic()
	t.Topic = "relay"
	t.TopicID = [16]byte{0xfa, 0xce}
	for i := int32(0); i < 2; i++ {
		p := kmsg.NewFetchResponseTopicPartition()
		p.Partition, p.HighWatermark = i, 1000
		if i == 0 {
			p.RecordBatches = make([]byte, recordsLen)
			for j := range p.RecordBatches {
				p.RecordBatches[j] = byte(j * 7)
			}
		} else if len(nodes) > 0 {
			p.ErrorCode = 6 // NOT_LEADER_OR_FOLLOWER
			p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = nodes[0].NodeID, 3
		}
		t.Partitions = append(t.Partitions, p)
	}
	resp.Topics = append(resp.Topics, t)
	resp.Brokers = nodes
	return resp.AppendTo(nil)
}
