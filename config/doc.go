// Package config is the proxy's configuration: the [Config] struct read
// from YAML and flags (config.example.yaml documents every key), its
// defaults ([Config.EnsureDefaults]) and checks ([Config.Validate]), the
// constants its keys take, and what follows from it alone: the address
// each broker node's listener binds and is advertised at
// ([Config.NodeAddrs]), and the replicas' layout ([Config.ReplicaLayout]:
// which replica owns which node, where each is reached), and the dedup
// settings as the decision core takes them ([DedupConfig.CoreSettings]).
//
// It reads no files and opens no sockets; errors wrap [ErrInvalidConfig]
// and speak in the configuration's own terms.
package config
