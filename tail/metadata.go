package tail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/clock"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// Metadata asks the broker at addr for the cluster's metadata on a
// connection of the proxy's own: over TLS with upstream_tls, authenticated
// with upstream_sasl when that is set, bounded by ctx. With topics false it
// asks for the brokers only; with topics, for every topic at the newest
// Metadata version both sides know, up to v12 (topic IDs, which Produce
// v13 names topics by, come with v10). An error after connecting says what
// the cluster likely requires.
func (cs *Conns) Metadata(ctx context.Context, addr string, topics bool) (*kmsg.MetadataResponse, error) {
	nc, err := cs.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(clock.Real.Now()) })
	defer stop()

	conn := cs.Wrap(nc)
	if err := conn.Authenticate(ctx, cs.SASL, addr); err != nil {
		return nil, fmt.Errorf("as upstream_sasl.user %q: %w", cs.User, err)
	}
	version := int16(MetadataVersion)
	if topics {
		if version, err = conn.NewestMetadata(); err != nil {
			return nil, cs.hint(err)
		}
	}
	req := kmsg.NewPtrMetadataRequest()
	req.SetVersion(version)
	if !topics {
		req.Topics = []kmsg.MetadataRequestTopic{} // no topics, only brokers
	} // nil: every topic
	resp := kmsg.NewPtrMetadataResponse()
	resp.SetVersion(version)
	if err := conn.RoundTrip(req, resp); err != nil {
		return nil, cs.hint(fmt.Errorf("metadata probe: %w", err))
	}
	return resp, nil
}

// hint adds the likely cause to a request that failed after connecting: a
// broker that closes an unauthenticated connection wants SASL; one that
// closes it or answers with a TLS record (Java sends an alert) wants TLS.
func (cs *Conns) hint(err error) error {
	var wants []string
	closed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	if !cs.TLS && (closed || errors.Is(err, protocol.ErrLooksLikeTLS) || errors.Is(err, protocol.ErrFrameTooLarge)) {
		wants = append(wants, "TLS (upstream_tls, --upstream-tls)")
	}
	if closed && cs.SASL == nil {
		wants = append(wants, "SASL (upstream_sasl, --upstream-sasl-*)")
	}
	if len(wants) == 0 {
		return err
	}
	return fmt.Errorf("%w (does the cluster require %s?)", err, strings.Join(wants, " or "))
}

// PartitionsLedBy asks a broker of bootstrap, one after another until one
// answers, which partitions node leads, keyed as t keys them. The topics of
// the answer are interned in t (they come from the cluster): a replica that
// just started knows none yet, and takes the legacy state of their
// partitions back from a peer.
func (cs *Conns) PartitionsLedBy(ctx context.Context, bootstrap []string, node int32, t *seqstate.Table) ([]seqstate.Key, error) {
	var errs []error
	for _, addr := range bootstrap {
		conn, err := cs.Open(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		req.SetVersion(MetadataVersion) // nil topics: every topic
		resp := kmsg.NewPtrMetadataResponse()
		resp.SetVersion(MetadataVersion)
		err = conn.RoundTrip(req, resp)
		conn.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		t.InternTopics(TopicRefs(resp.Topics))
		var keys []seqstate.Key
		for _, tp := range resp.Topics {
			if tp.Topic == nil || tp.ErrorCode != 0 {
				continue
			}
			id, ok := t.LookupTopic([]byte(*tp.Topic))
			if !ok {
				continue
			}
			for _, p := range tp.Partitions {
				if p.Leader == node {
					keys = append(keys, seqstate.Key{Topic: id, Partition: p.Partition})
				}
			}
		}
		return keys, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream brokers")
	}
	return nil, errors.Join(errs...)
}

// TopicRefs are the topics of a Metadata response that the cluster
// answered without error, as a table interns them.
func TopicRefs(topics []kmsg.MetadataResponseTopic) []seqstate.TopicRef {
	refs := make([]seqstate.TopicRef, 0, len(topics))
	for _, tp := range topics {
		if tp.Topic != nil && tp.ErrorCode == 0 {
			refs = append(refs, seqstate.TopicRef{Name: *tp.Topic, ID: tp.TopicID, Partitions: int32(len(tp.Partitions))})
		}
	}
	return refs
}
