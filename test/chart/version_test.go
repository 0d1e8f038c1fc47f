//go:build integration

package chart

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/gputopo/gputopo/test/harness"
)

// gputopo-scheduler runs the cluster's own kube-scheduler release unless a
// tag is set, and every supported cluster reads the one configuration API
// the chart writes, kubescheduler.config.k8s.io/v1. Versions the chart
// does not support, and tags newer than the cluster or more than one minor
// version behind it (Kubernetes' version skew policy), are refused.
func TestSchedulerImageFollowsTheCluster(t *testing.T) {
	for name, tc := range map[string]struct {
		kubeVersion, values string
		// wantImage, or wantErr: parts of helm's error.
		wantImage string
		wantErr   []string
	}{
		"oldest supported cluster":           {kubeVersion: "1.30.0", wantImage: "registry.k8s.io/kube-scheduler:v1.30.0"},
		"a 1.33 cluster":                     {kubeVersion: "v1.33.4", wantImage: "registry.k8s.io/kube-scheduler:v1.33.4"},
		"a vendor's build drops its suffix":  {kubeVersion: "v1.31.2-eks-7f9249a", wantImage: "registry.k8s.io/kube-scheduler:v1.31.2"},
		"the tests' cluster":                 {kubeVersion: kubeVersion, wantImage: "registry.k8s.io/kube-scheduler:v" + kubeVersion},
		"a set tag of the cluster's minor":   {kubeVersion: "1.34.1", values: "scheduler: {image: {tag: v1.34.0}}", wantImage: "registry.k8s.io/kube-scheduler:v1.34.0"},
		"a set tag one minor behind":         {kubeVersion: "1.34.1", values: "scheduler: {image: {tag: v1.33.9}}", wantImage: "registry.k8s.io/kube-scheduler:v1.33.9"},
		"a set tag that is not a version":    {kubeVersion: "1.34.1", values: "scheduler: {image: {tag: latest-fips}}", wantImage: "registry.k8s.io/kube-scheduler:latest-fips"},
		"another registry mirrors the image": {kubeVersion: "1.32.3", values: "scheduler: {image: {repository: mirror.example/kube-scheduler}}", wantImage: "mirror.example/kube-scheduler:v1.32.3"},
		"a cluster older than the chart supports": {kubeVersion: "1.29.10",
			wantErr: []string{">=1.30.0-0", "1.29.10"}},
		"a set tag newer than the cluster": {kubeVersion: "1.34.1", values: "scheduler: {image: {tag: v1.35.0}}",
			wantErr: []string{"scheduler.image.tag: v1.35.0 is newer than the cluster (Kubernetes v1.34.1)"}},
		"a set tag two minors behind": {kubeVersion: "1.34.1", values: "scheduler: {image: {tag: v1.32.5}}",
			wantErr: []string{"scheduler.image.tag: v1.32.5 is more than one minor version older than the cluster"}},
	} {
		t.Run(name, func(t *testing.T) {
			rel := release{name: "gputopo", namespace: "gputopo-system", values: tc.values}
			objs, err := rel.renderFor(t, tc.kubeVersion)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("helm rendered for Kubernetes %s with %q; want a refusal", tc.kubeVersion, tc.values)
				}
				for _, part := range tc.wantErr {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("error %q does not say %q", err, part)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var dep appsv1.Deployment
			into(t, find(t, objs, "Deployment", "gputopo-scheduler"), &dep)
			if got := dep.Spec.Template.Spec.Containers[0].Image; got != tc.wantImage {
				t.Errorf("scheduler image %q, want %q", got, tc.wantImage)
			}
			// Strictly decoded as kubescheduler.config.k8s.io/v1.
			if _, err := harness.ParseSchedulerConfig(configData(t, objs, "gputopo-scheduler", "config.yaml")); err != nil {
				t.Errorf("scheduler configuration for Kubernetes %s: %v", tc.kubeVersion, err)
			}
		})
	}
}
