// Package client is the clients' side of the proxy's sockets in the
// simulation (docs/simulation.md, "The clients" and "The network"): client
// models, each standing for a real client (docs/clients.md) and modelling
// only what decides how the proxy sees its retries — what it tells the
// proxy about itself (client id, host, principal, the software name of its
// ApiVersions v3+ request), how it writes a batch without a producer id,
// and how it sends records again after a failure; their connections
// through the network to a replica's listener (latency per hop, in order
// per connection, and the network's faults: an answer lost with its
// connection, a cut, a silent cut, a middlebox); and the Ledger of every
// record they made and every request they sent.
//
// # Contract
//
//   - A client sees the run only through Env (the virtual clock, the run's
//     seeded source, the leaders as metadata tells them, a dial to the
//     replica serving a node), and the proxy only through its connections:
//     a Conn carries requests, an end of stream or a reset to the Proxy the
//     replica's session implements, and answers or the proxy's close back.
//   - Deterministic given Env: every draw comes from Env and every step is
//     an event on its clock, so the same run draws and schedules the same.
//   - What the proxy and the broker did with a request or a record
//     (Request's fields from Replica on, Record's Written and Upstream,
//     Conn's FinAt and ToldAt) is written by the world for the checks; no
//     client model reads it.
package client
