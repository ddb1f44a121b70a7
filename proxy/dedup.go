package proxy

import (
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/decide"
	"github.com/dedupproxy/dedupproxy/metrics"
	"github.com/dedupproxy/dedupproxy/protocol"
	"github.com/dedupproxy/dedupproxy/seqstate"
)

// newCore builds the decision core and its tables for cfg; all nil in
// mode off, which keeps no tables.
func newCore(cfg *Config) (*decide.Core, *seqstate.Table, *seqstate.KeyTable, error) {
	dc := &cfg.Dedup
	if dc.Mode == config.DedupOff {
		return nil, nil, nil, nil
	}
	t, err := seqstate.New(seqstate.Config{
		MaxEntries:           dc.MaxEntries,
		RetainedBatches:      dc.RetainedBatches,
		ProducerIDExpiration: dc.ProducerIDExpiration,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	// The key table (tens of MB at its default cap) only when some topic
	// uses idempotency keys at start.
	var keys *seqstate.KeyTable
	for _, tc := range dc.Topics {
		if tc.IdempotencyKey != nil {
			if keys, err = seqstate.NewKeyTable(seqstate.KeyConfig{MaxKeys: dc.Keys.MaxKeys, TTL: dc.Keys.TTL}); err != nil {
				return nil, nil, nil, err
			}
			break
		}
	}
	core := decide.New(decide.Config{Table: t, Keys: keys, Window: dc.Legacy.Window, Scope: dc.CoreScope(),
		MaxRecords: dc.Legacy.MaxRecords, Warm: *dc.Warm.Enabled}, dc.CoreSettings())
	return core, t, keys, nil
}

// keysOn reports whether some topic reads idempotency keys now: requests
// are then read whole (relay/holes.go).
func (s *Server) keysOn() bool {
	if s.core == nil || s.keys == nil {
		return false
	}
	for _, ts := range s.core.Settings().Topics {
		if ts.KeyHeader != "" {
			return true
		}
	}
	return false
}

// noteResponse learns from a broker response what authenticated needs:
// the end of a SASL exchange, or that the cluster answers clients that
// never authenticated (so it requires no authentication).
func (c *session) noteResponse(p *pending, body []byte) {
	switch kmsg.Key(p.key) {
	case kmsg.ApiVersions:
	case kmsg.SASLHandshake, kmsg.SASLAuthenticate:
		off, err := protocol.ResponseBodyOffset(body, p.key, p.version)
		if err != nil {
			off = len(body) // an undecodable answer: a failure
		}
		c.auth.NoteAnswer(p.sasl, body[off:], p.version, &c.s.authEnv, c.log)
	default:
		if !c.auth.SASL.Started.Load() {
			if !c.s.openUpstream.Load() {
				c.s.openUpstream.Store(true)
			}
		} else {
			c.auth.SASL.Served()
		}
	}
}

// isTransactionalInit reports whether an InitProducerId request names a
// transactional id: its response then fences the producer's older epochs
// (seqstate.Table.ObserveInitProducerID). Rare, so kmsg decoding is fine.
func isTransactionalInit(body []byte, version int16) bool {
	req := kmsg.NewPtrInitProducerIDRequest()
	req.SetVersion(version)
	return req.ReadFrom(body) == nil && req.TransactionalID != nil
}

// observeInit feeds a transactional InitProducerId response to the table.
// The table then counts a later batch of an older epoch as fenced; the
// batch still goes to the broker, which decides (the floor is only as good
// as the broker's transaction verification, KIP-890).
func (c *session) observeInit(p *pending, body []byte) {
	resp := kmsg.NewPtrInitProducerIDResponse()
	resp.SetVersion(p.version)
	if resp.ReadFrom(body) == nil && resp.ErrorCode == 0 {
		c.s.table.ObserveInitProducerID(resp.ProducerID, resp.ProducerEpoch, c.s.now())
	}
}

// testHookFn, when a test sets it, runs at named points of the Produce path
// so that the test can inject a panic there. It is nil in production.
var testHookFn atomic.Pointer[func(where string)]

func testHook(where string) {
	if f := testHookFn.Load(); f != nil {
		(*f)(where)
	}
}

// SetDedup applies the dedup settings a running proxy can change (mode,
// legacy match, per-topic settings), as SIGHUP does; sizes and windows
// need a restart. Mode off at start has no tables: leaving it needs a
// restart too. It returns the keys it applied.
func (s *Server) SetDedup(cfg DedupConfig) ([]string, error) {
	if !s.started {
		return nil, errors.New("proxy: not started")
	}
	if s.core == nil && cfg.Mode != config.DedupOff {
		return nil, fmt.Errorf("%w: dedup.mode %s: the proxy started with dedup off, which keeps no tables; restart it", config.ErrInvalidConfig, cfg.Mode)
	}
	if s.core == nil {
		return nil, nil
	}
	test := s.Config
	test.Dedup.Mode, test.Dedup.Legacy.Match, test.Dedup.Topics = cfg.Mode, cfg.Legacy.Match, cfg.Topics
	test.EnsureDefaults()
	if err := test.Validate(); err != nil {
		return nil, err
	}
	next := test.Dedup.CoreSettings()
	if s.keys == nil {
		for name, ts := range next.Topics {
			if ts.KeyHeader != "" {
				return nil, fmt.Errorf("%w: dedup.topics[%q].idempotency_key: idempotency keys were off for every topic at start, so there is no key table; restart to turn them on", config.ErrInvalidConfig, name)
			}
		}
	}
	s.setDedupMu.Lock()
	defer s.setDedupMu.Unlock()
	old := s.core.Settings()
	s.step(&decide.Event{Kind: decide.EvSettings, Settings: next}, s.now(), nil)
	var oldCounters map[string]*metrics.TopicCounter
	if p := s.topicCounters.Load(); p != nil {
		oldCounters = *p
	}
	counters := s.Metrics.TopicCounters(&test.Dedup, oldCounters)
	s.topicCounters.Store(&counters)
	var applied []string
	if old.Mode != next.Mode {
		applied = append(applied, "dedup.mode")
	}
	if old.Match != next.Match {
		applied = append(applied, "dedup.legacy.match")
	}
	if !reflect.DeepEqual(old.Topics, next.Topics) || len(counters) != len(oldCounters) || !sameKeys(counters, oldCounters) {
		applied = append(applied, "dedup.topics")
	}
	return applied, nil
}

func sameKeys(a, b map[string]*metrics.TopicCounter) bool {
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return len(a) == len(b)
}
