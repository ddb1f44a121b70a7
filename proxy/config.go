package proxy

import "github.com/dedupproxy/dedupproxy/config"

// The configuration lives in package config; these aliases let the
// command, the benchmark and the tests keep writing proxy.Config.
type (
	Config               = config.Config
	NodeConfig           = config.NodeConfig
	TLSConfig            = config.TLSConfig
	UpstreamTLSConfig    = config.UpstreamTLSConfig
	SASLConfig           = config.SASLConfig
	DedupConfig          = config.DedupConfig
	WarmConfig           = config.WarmConfig
	KeysConfig           = config.KeysConfig
	IdempotencyKeyConfig = config.IdempotencyKeyConfig
	LegacyConfig         = config.LegacyConfig
	TopicDedupConfig     = config.TopicDedupConfig
)
