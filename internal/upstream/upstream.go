// Package upstream builds franz-go client options that reach a cluster the
// way the proxy's own connections do: its bootstrap brokers, upstream_tls
// and upstream_sasl from one proxy.Config. dedupproxy audit reads topics
// with them, and the tests against a real cluster (DEDUPPROXY_TEST_UPSTREAM)
// create and read their topics with them.
//
// It lives under internal/ because cmd/dedupproxy, e2e and bench use it.
package upstream

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupproxy/dedupproxy/auth"
	"github.com/dedupproxy/dedupproxy/config"
	"github.com/dedupproxy/dedupproxy/proxy"
)

// ErrEmbedded: the embedded cluster exists only inside a running proxy,
// so nothing else can reach it.
var ErrEmbedded = errors.New(`upstream: no cluster to reach: upstream is "embedded" or not set; name the cluster's bootstrap brokers (--upstream or upstream: in the config file)`)

// ClientOpts returns the seed brokers, TLS and SASL options of cfg's
// upstream; cfg is expected to have passed EnsureDefaults and Validate.
func ClientOpts(cfg proxy.Config) ([]kgo.Opt, error) {
	if len(cfg.Upstream) == 0 || cfg.Upstream[0] == config.EmbeddedUpstream {
		return nil, ErrEmbedded
	}
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Upstream...)}
	if cfg.DialTimeout > 0 {
		opts = append(opts, kgo.DialTimeout(cfg.DialTimeout))
	}
	tc, err := auth.UpstreamClientConfig(cfg.UpstreamTLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if mech := auth.SASLMechanism(cfg.UpstreamSASL); mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}
