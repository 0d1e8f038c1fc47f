// Command coredns is CoreDNS with the plugins a one-node test cluster
// needs to resolve Services (kubernetes, plus errors, log, health and
// ready), built by hack/tools/build.sh into bin/coredns for the install
// tests: pods reach the release's Services by name, as on a real cluster.
// The plugin order is CoreDNS's own (core/dnsserver/zdirectives.go);
// plugins not imported here are skipped.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
