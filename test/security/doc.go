// Package security holds the security suite: attempts on the system as a
// tenant with pod-create rights, as a client on the pod network and as a
// compromised node would make them, each kept as a test on the real control
// plane (kube-apiserver, etcd, kube-scheduler, and a real kubelet where
// devices are involved). `make test-security` runs it alone; `make test`
// runs it with the other integration suites.
package security
