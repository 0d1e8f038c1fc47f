// Package install installs gputopo's Helm chart for real on a one-node
// cluster: kube-apiserver, etcd, kube-controller-manager, kube-proxy and a
// kubelet on containerd and runc, with the image `make image` builds
// imported rather than pulled. Integration tests only (build tag
// integration); root is required.
package install
