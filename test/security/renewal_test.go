//go:build integration

package security

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
)

// The real kube-scheduler, with the chart's scheduler configuration over
// mutual TLS, keeps binding GPU pods while cert-manager renews both the
// extender's serving certificate and the scheduler's client certificate
// under it (kubelet swapping each Secret volume): neither process
// restarts, and no pod waits for more than the scheduler's usual retry.
func TestCertificateRenewalMidRunDoesNotInterruptBinding(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	gpuCluster(t, cp, map[string]map[string]string{"gpu-a": nil, "gpu-b": nil})
	te := startTLSExtender(t, cp)

	clientDir := filepath.Join(t.TempDir(), "scheduler-tls")
	issueClient := func() {
		harness.WriteSecretVolume(t, clientDir, te.ca.SecretData(t, harness.LeafSpec{
			CommonName: "gputopo-scheduler", Usages: []string{"client auth"},
		}))
	}
	issueClient()
	cfg := harness.ChartSchedulerConfig(t, te.base)
	ext := &cfg.Extenders[0]
	ext.EnableHTTPS = true
	ext.TLSConfig = &schedconfigv1.ExtenderTLSConfig{
		CertFile: filepath.Join(clientDir, "tls.crt"),
		KeyFile:  filepath.Join(clientDir, "tls.key"),
		CAFile:   filepath.Join(clientDir, "ca.crt"),
	}
	sched := cp.StartScheduler(t, cfg)

	// 16 pods of 1 GPU fill both nodes; every fourth is created right
	// after a renewal, alternating the two certificates.
	const pods = 16
	for i := range pods {
		switch {
		case i > 0 && i%8 == 4:
			te.renew(t)
			t.Logf("renewed the extender's serving certificate before pod %d", i)
		case i > 0 && i%8 == 0:
			issueClient()
			t.Logf("renewed the scheduler's client certificate before pod %d", i)
		}
		p := harness.GPUPod(metav1.NamespaceDefault, fmt.Sprintf("train-%02d", i), 1)
		p.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
		if err := cp.Client.Create(ctx, p); err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var list corev1.PodList
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, nil
		}
		bound := 0
		for _, p := range list.Items {
			if p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationAssignedGPUs] != "" {
				bound++
			}
		}
		return bound == pods, nil
	})
	if err != nil {
		for _, p := range list.Items {
			t.Logf("pod %s: node %q gpus %q conditions %v", p.Name, p.Spec.NodeName, p.Annotations[v1alpha1.AnnotationAssignedGPUs], p.Status.Conditions)
		}
		t.Fatalf("not every pod was bound through the extender across the renewals: %v", err)
	}
	seen := map[string]string{}
	for _, p := range list.Items {
		for _, g := range splitGPUs(t, p.Annotations[v1alpha1.AnnotationAssignedGPUs]) {
			if other, dup := seen[g]; dup {
				t.Errorf("GPU %s assigned to both %s and %s", g, other, p.Name)
			}
			seen[g] = p.Name
		}
	}
	if exited, err := sched.Exited(); exited {
		t.Fatalf("kube-scheduler exited during the renewals: %v", err)
	}
	t.Logf("all %d pods bound across two serving and one client certificate renewals, no process restarted", pods)
}

func splitGPUs(t *testing.T, v string) []string {
	t.Helper()
	l, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, v)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
