//go:build tools

package apiserver

// kube-apiserver is built from this module (its requirements and sums are
// this module's), though no package here imports it.
import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"
