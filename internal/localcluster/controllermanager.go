package localcluster

import (
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
	return StartControllerManagerWith(kubeconfig, dir, nil, controllers...)
}

// StartControllerManagerWith is StartControllerManager with extra flags
// (e.g. --root-ca-file for the root CA publisher).
func StartControllerManagerWith(kubeconfig, dir string, flags []string, controllers ...string) (*Process, error) {
	bin, err := Binary("kube-controller-manager")
	if err != nil {
		return nil, err
	}
	return startServing("kube-controller-manager", dir, time.Now().UnixNano(), bin, func(port int) []string {
		return append([]string{
			"--kubeconfig=" + kubeconfig,
			"--authentication-kubeconfig=" + kubeconfig,
			"--authorization-kubeconfig=" + kubeconfig,
			"--controllers=" + strings.Join(controllers, ","),
			"--leader-elect=false",
			"--use-service-account-credentials=false",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--kube-api-qps=200",
			"--kube-api-burst=400",
			"--v=1",
		}, flags...)
	})
}
