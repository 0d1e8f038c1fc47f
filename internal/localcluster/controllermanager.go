package localcluster

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// StartControllerManager runs the real kube-controller-manager with only the
// named controllers (e.g. "job", "garbage-collector-controller"), against
// the cluster kubeconfig names, logging into dir. A bare control plane has
// no controllers at all: this is what turns a Job into pods. The kubeconfig's
// user needs broad rights, since the controllers use its credentials rather
// than per-controller service accounts. It returns once /healthz answers.
func StartControllerManager(kubeconfig, dir string, controllers ...string) (*Process, error) {
	bin, err := Binary("kube-controller-manager")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("free port: %w", err)
	}
	p, err := StartProcess("kube-controller-manager", filepath.Join(dir, fmt.Sprintf("kube-controller-manager-%d.log", time.Now().UnixNano())), bin,
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--v=1",
	)
	if err != nil {
		return nil, err
	}
	if err := WaitHealthy(p, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), time.Minute); err != nil {
		p.Stop()
		return nil, fmt.Errorf("kube-controller-manager did not become healthy: %w\n%s", err, p.Tail(30))
	}
	return p, nil
}
