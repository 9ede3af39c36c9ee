// Package apiserver checks assay's Kubernetes manifests against a real
// kube-apiserver: it builds kube-apiserver from k8s.io/kubernetes (this
// module pins it, with its staging modules), starts it on Debian's etcd,
// loads the CRDs the manifests use (CloudNativePG, the Barman Cloud Plugin
// and KEDA, and for the optional components prometheus-operator,
// cert-manager and Gateway API, read from their projects' Go modules at
// pinned versions, as they publish them) and applies every kustomization
// found under deploy/k8s, and every optional component on top of the
// kustomizations it is for, and every example manifest (*.example.yaml),
// with a server-side dry run, fields validated strictly. It is its own module, run by make k8s-apiserver-check and not
// by make test: building kube-apiserver takes minutes.
package apiserver
