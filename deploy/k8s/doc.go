// Package k8s holds the tests of assay's Kubernetes manifests: every overlay
// rendered with kustomize, every object decoded strictly, and every service
// started with its manifest's environment.
package k8s
