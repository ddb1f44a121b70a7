package e2e

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// traceProduce is one line of the shim's Produce trace (E2E_DEBUG=1): a
// request, with each batch's partition and the values it carries, or its
// response, with each partition's offset or error; the client's port names
// its connection, and the shim's port towards what it fronts (the proxy
// logs that as the client's) follows it. The retry shapes of a run are read
// from it.
func traceProduce(client, up net.Conn, frame []byte, aw awaiting, request bool) string {
	var b strings.Builder
	_, port, _ := net.SplitHostPort(client.RemoteAddr().String())
	_, upPort, _ := net.SplitHostPort(up.LocalAddr().String())
	fmt.Fprintf(&b, "conn %s/%s corr %d", port, upPort, aw.corr)
	if !request {
		if aw.drop {
			b.WriteString(" response DROPPED")
			return b.String()
		}
		resp := kmsg.NewPtrProduceResponse()
		resp.SetVersion(aw.version)
		body := frame[8:]
		if resp.IsFlexible() {
			r := kbin.Reader{Src: body}
			kmsg.SkipTags(&r)
			body = r.Src
		}
		if err := resp.ReadFrom(body); err != nil {
			fmt.Fprintf(&b, " response: %v", err)
			return b.String()
		}
		b.WriteString(" response")
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				fmt.Fprintf(&b, " p%d", p.Partition)
				if p.ErrorCode != 0 {
					fmt.Fprintf(&b, " error %d", p.ErrorCode)
				} else {
					fmt.Fprintf(&b, " offset %d", p.BaseOffset)
				}
			}
		}
		return b.String()
	}
	r := kbin.Reader{Src: frame[4:]}
	r.Int16()
	r.Int16()
	r.Int32()
	r.NullableString()
	req := kmsg.NewPtrProduceRequest()
	req.SetVersion(aw.version)
	if req.IsFlexible() {
		kmsg.SkipTags(&r)
	}
	if err := req.ReadFrom(r.Src); err != nil {
		fmt.Fprintf(&b, " request: %v", err)
		return b.String()
	}
	if aw.drop {
		b.WriteString(" (its response will be dropped)")
	}
	for _, t := range req.Topics {
		for _, p := range t.Partitions {
			fmt.Fprintf(&b, " p%d %s", p.Partition, batchValues(p.Records))
		}
	}
	return b.String()
}

// batchValues describes the records of concatenated v2 batches: their
// count and the indices of their values (value), runs of consecutive
// ones as a-b.
func batchValues(raw []byte) string {
	idx, other, err := batchIndices(raw)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d records [", len(idx)+other)
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		if j == i {
			fmt.Fprint(&b, idx[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", idx[i], idx[j])
		}
		i = j + 1
	}
	b.WriteByte(']')
	return b.String()
}

// batchIndices returns the indices of the values (value) of the records
// of concatenated uncompressed v2 batches, in order, and how many records
// carry another value.
func batchIndices(raw []byte) (idx []int, other int, err error) {
	for len(raw) >= 12 {
		end := 12 + int(int32(binary.BigEndian.Uint32(raw[8:12])))
		if end < 12 || end > len(raw) {
			return idx, other, errors.New("truncated batch")
		}
		var batch kmsg.RecordBatch
		if err := batch.ReadFrom(raw[:end]); err != nil {
			return idx, other, fmt.Errorf("undecodable: %w", err)
		}
		raw = raw[end:]
		if batch.Attributes&0x07 != 0 {
			return idx, other, errors.New("compressed")
		}
		recs := batch.Records
		for i := int32(0); i < batch.NumRecords && len(recs) > 0; i++ {
			var rec kmsg.Record
			if err := rec.ReadFrom(recs); err != nil {
				return idx, other, fmt.Errorf("undecodable record: %w", err)
			}
			n := int(rec.Length) + varintLen(int64(rec.Length))
			if n > len(recs) {
				break
			}
			recs = recs[n:]
			if j, err := indexOf(rec.Value); err == nil {
				idx = append(idx, j)
			} else {
				other++
			}
		}
	}
	return idx, other, nil
}

// varintLen is the length of v as a zigzag varint.
func varintLen(v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	n := 1
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// logWhereStored logs, for E2E_DEBUG=1, where the log holds each value
// written more than once (partition@offset of every copy), reading the
// topic's total records straight from the cluster: with the shim's trace,
// which request wrote each copy.
func logWhereStored(t testing.TB, c *testCluster, topic string, twice map[string]bool, total int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(append(c.clientOpts(t),
		kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))...)
	if err != nil {
		t.Logf("where stored: %v", err)
		return
	}
	defer cl.Close()
	where := map[string][]string{}
	seen := 0
	// Each poll returns records, or nothing once the context ends, which
	// bounds the whole.
	for i := 0; i < 10000 && seen < total && ctx.Err() == nil; i++ {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			seen++
			if twice[string(r.Value)] {
				where[string(r.Value)] = append(where[string(r.Value)], fmt.Sprintf("p%d@%d", r.Partition, r.Offset))
			}
		})
	}
	vals := make([]string, 0, len(where))
	for v := range where {
		vals = append(vals, v)
	}
	sort.Strings(vals)
	var b strings.Builder
	for _, v := range vals {
		fmt.Fprintf(&b, "\n%s: %s", v, strings.Join(where[v], " "))
	}
	t.Logf("where the values written more than once are (%d records read):%s", seen, b.String())
}
