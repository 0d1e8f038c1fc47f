//go:build integration

package extender_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gputopo/gputopo/placement/cluster"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/schedplugin"
	"github.com/gputopo/gputopo/test/harness"
)

// pluginProfile is the second scheduler's profile in the side-by-side test.
const pluginProfile = "gputopo-plugin"

// TestTwoGputopoSchedulersOnSharedNodesNeverIssueAGPUTwice runs both modes
// at once on the same two 8-GPU nodes, as a migration from one to the
// other or a second release would: kube-scheduler with the extender
// (profile gputopo-scheduler) and the plugin build (profile
// gputopo-plugin). Ten bursts of pods, each split between the two and
// asking for more GPUs than there are: no GPU is bound to two pods and no
// node goes over capacity, because only the holder of the decider Lease
// decides; the other's pods wait with a message that names the holder.
// Halfway the holder is killed: the other takes over, binds its waiting
// pods without touching GPUs the first bound, and the restarted first one
// now waits naming it. Last, the plugin build is stopped with SIGTERM: it
// releases the Lease before it exits.
func TestTwoGputopoSchedulersOnSharedNodesNeverIssueAGPUTwice(t *testing.T) {
	e := newEnv(t, 2)
	ctx := harness.Context(t)
	ext := startExtenderSystem(t, e).(*extenderSystem)
	if err := localcluster.GrantExtenderRole(ctx, e.cp.Client, harness.SchedulerUser); err != nil {
		t.Fatal(err)
	}
	plug := e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin, Name: pluginProfile,
		PluginArgs: schedplugin.Args{SchedulerNames: []string{pluginProfile}},
		Configure: func(cfg *schedconfigv1.KubeSchedulerConfiguration) {
			cfg.Profiles[0].SchedulerName = ptr.To(pluginProfile)
		}})
	harness.WaitCore(t, plug, localcluster.TotalGPUs(len(e.nodes)*gpusPerNode))
	lease := cluster.DeciderLeaseName("nvidia.com/gpu")
	holder := func() string {
		l, err := e.cp.Clientset.CoordinationV1().Leases(cluster.DefaultDeciderLeaseNamespace).Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return ptr.Deref(l.Spec.HolderIdentity, "")
	}
	harness.Poll(t, time.Minute, "the extender to hold the decider Lease", func() (bool, string) {
		h := holder()
		return strings.Contains(h, "(extender mode"), "holder " + h
	})

	deciding, waiting := v1alpha1DefaultScheduler, pluginProfile
	for rep := range 10 {
		if rep == 5 {
			// The decider dies mid-run: the other takes over once the
			// Lease expires, and binds the pods that waited for it.
			ext.kill(t)
			harness.Poll(t, 2*time.Minute, "the plugin build to take the decider Lease", func() (bool, string) {
				h := holder()
				return strings.Contains(h, "(plugin mode"), "holder " + h
			})
			harness.Poll(t, 2*time.Minute, "the plugin build to bind the pods that waited for it", func() (bool, string) {
				n := 0
				for _, p := range listPods(t, e) {
					if p.Spec.SchedulerName == pluginProfile && p.Spec.NodeName != "" {
						n++
					}
				}
				return n > 0, fmt.Sprintf("%d of its pods bound", n)
			})
			auditPods(t, listPods(t, e))
			ext.restart(t)
			deciding, waiting = pluginProfile, v1alpha1DefaultScheduler
		}
		deleteAll(t, e)
		var pods []*corev1.Pod
		for i := range 12 {
			p := gpuPod(fmt.Sprintf("r%d-%02d", rep, i), int64(1+i%2), "")
			p.Spec.SchedulerName = v1alpha1DefaultScheduler
			if i%2 == 1 {
				p.Spec.SchedulerName = pluginProfile
			}
			pods = append(pods, p)
		}
		createAll(t, e, pods)
		want := "decided by another gputopo scheduler"
		harness.Poll(t, 2*time.Minute, fmt.Sprintf("burst %d: %s to bind, %s's pods to wait naming it", rep, deciding, waiting), func() (bool, string) {
			bound, refused := 0, 0
			var last string
			for _, p := range listPods(t, e) {
				switch {
				case p.Spec.NodeName != "":
					if p.Spec.SchedulerName != deciding {
						return false, fmt.Sprintf("pod %s of %s was bound although %s holds the decider Lease", p.Name, p.Spec.SchedulerName, deciding)
					}
					bound++
				case p.Spec.SchedulerName == waiting:
					if msg := scheduledFalseMessage(&p); strings.Contains(msg, want) {
						refused++
					} else {
						last = msg
					}
				}
			}
			return bound > 0 && refused == 6, fmt.Sprintf("%d bound, %d of 6 waiting with the holder's name (last: %q)", bound, refused, last)
		})
		pods2 := listPods(t, e)
		auditPods(t, pods2)
		for _, p := range pods2 {
			if p.Spec.SchedulerName == waiting {
				if msg := scheduledFalseMessage(&p); !strings.Contains(msg, "holds the decider Lease kube-system/"+lease) || !strings.Contains(msg, "mode, scheduler "+deciding+")") {
					t.Errorf("burst %d: pod %s waits with %q; want the decider Lease and the holder (%s) named", rep, p.Name, msg, deciding)
				}
				break
			}
		}
	}
	// Stopped as a rolling update stops it (SIGTERM), the plugin build
	// releases the Lease before it exits, so the extender takes it within
	// its retry period instead of after the Lease's 15s expire.
	stopped := time.Now()
	plug.Stop()
	harness.Poll(t, 8*time.Second, "the stopped plugin build to release the decider Lease", func() (bool, string) {
		h := holder()
		return !strings.Contains(h, "(plugin mode"), fmt.Sprintf("holder %s, %s after SIGTERM", h, time.Since(stopped).Round(time.Second))
	})
	if t.Failed() {
		t.Logf("kube-scheduler (extender mode) log:\n%s\nplugin build log:\n%s", ext.tail(), plug.Tail(30))
	}
}

// v1alpha1DefaultScheduler is the extender profile's scheduler name.
const v1alpha1DefaultScheduler = "gputopo-scheduler"
