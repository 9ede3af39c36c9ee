// Package apiserver checks assay's Kubernetes manifests against a real
// kube-apiserver: it builds kube-apiserver from k8s.io/kubernetes (this
// module pins it, with its staging modules), starts it on Debian's etcd,
// loads the CloudNativePG, Barman Cloud Plugin and KEDA CRDs (read from
// their projects' Go modules at pinned versions, as they publish them) and applies every kustomization of every
// cell with a server-side dry run, fields validated strictly. It is its
// own module, run by make k8s-apiserver-check and not by make test:
// building kube-apiserver takes minutes.
package apiserver
