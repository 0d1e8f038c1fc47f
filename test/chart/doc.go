// Package chart tests the installation artefacts: the Helm chart in
// charts/gputopo and the cert-manager manifests in certs/. It renders the
// chart with the real helm binary, checks the rendered objects against the
// components' own code (webhook registration, configuration decoders, flag
// sets, RBAC rules), applies them to a real kube-apiserver with server-side
// dry-run, and runs the rendered scheduler configuration in the real
// kube-scheduler against the real extender.
//
// The tests need bin/helm, etcd, kube-apiserver and kube-scheduler (make
// tools) and the integration build tag. The package imports components, so
// no component may import it.
package chart
