// Package deploy holds no code: its tests check the packaging next to it
// (deploy/Dockerfile, deploy/build.sh, the systemd unit, the Kubernetes
// manifests, the Grafana dashboard and the Prometheus alert rules) against
// the proxy they package. docs/operations.md explains them.
package deploy
