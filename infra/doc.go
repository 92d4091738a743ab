// Package infra holds no code: its directory holds kvroute's deployment
// manifests (k8s/: a kustomize base, components and overlays) and its
// tests check them, the Dockerfile and compose.yaml against the Kubernetes
// API types and against what the kvroute binary actually reads and serves.
// See README.md.
package infra
