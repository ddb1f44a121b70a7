// Package nodes keeps the proxy's map of the cluster's broker nodes
// (docs/reference.md, "Pointing clients at it"): each node's real address,
// learned from every response that names it ([Mapper], what a session
// hands package rewrite, also interns a Metadata response's topics), and
// the proxy listener that stands for it, started on first sight at the
// address the configuration gives the node. A node whose listener cannot
// start is left out of responses, never advertised at another address; a
// failed bind is retried at most every [BindRetryInterval]. With replicas,
// a node is advertised at the replica that serves it (package replica).
//
// It decides nothing about requests; the proxy gives it its clock,
// logger, metrics, and the functions that bind and serve a listener.
package nodes
