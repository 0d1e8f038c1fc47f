package webhook

import (
	"encoding/json"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "sigs.k8s.io/json"
)

// Objects are decoded with the apiserver's own JSON rules (case-sensitive
// keys, integers preserved) twice: once typed, for the decisions, and once
// into rawPod, which keeps what patches need to know about the raw
// document (which members exist, the exact bytes of env entries), so that
// a patch never drops a field this package's API types do not know.

type rawMeta struct {
	Annotations json.RawMessage `json:"annotations"`
	Labels      json.RawMessage `json:"labels"`
}

func (m *rawMeta) shape() metadataShape {
	if m == nil {
		return metadataShape{}
	}
	return metadataShape{present: true, annotations: rawPresent(m.Annotations), labels: rawPresent(m.Labels)}
}

type rawContainer struct {
	Env []json.RawMessage `json:"env"`
}

type rawPodSpec struct {
	Containers          []rawContainer `json:"containers"`
	InitContainers      []rawContainer `json:"initContainers"`
	EphemeralContainers []rawContainer `json:"ephemeralContainers"`
}

type rawPod struct {
	Metadata *rawMeta   `json:"metadata"`
	Spec     rawPodSpec `json:"spec"`
}

type rawJob struct {
	Spec struct {
		Template *struct {
			Metadata *rawMeta `json:"metadata"`
		} `json:"template"`
	} `json:"spec"`
}

func decodeInto(raw runtime.RawExtension, kind string, typed, shape any) error {
	if len(raw.Raw) == 0 {
		return fmt.Errorf("decode %s: request carries no object", kind)
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw.Raw, typed); err != nil {
		return fmt.Errorf("decode %s: %w", kind, err)
	}
	if shape != nil {
		if err := kjson.UnmarshalCaseSensitivePreserveInts(raw.Raw, shape); err != nil {
			return fmt.Errorf("decode %s: %w", kind, err)
		}
	}
	return nil
}

func decodePod(raw runtime.RawExtension) (*corev1.Pod, *rawPod, error) {
	pod, shape := &corev1.Pod{}, &rawPod{}
	if err := decodeInto(raw, "pod", pod, shape); err != nil {
		return nil, nil, err
	}
	// The typed and raw views must describe the same containers; they do
	// for any document both decoders accept, but a mismatch must never
	// index past an array.
	if len(shape.Spec.Containers) != len(pod.Spec.Containers) ||
		len(shape.Spec.InitContainers) != len(pod.Spec.InitContainers) ||
		len(shape.Spec.EphemeralContainers) != len(pod.Spec.EphemeralContainers) {
		return nil, nil, fmt.Errorf("decode pod: inconsistent container lists")
	}
	return pod, shape, nil
}

func decodeJob(raw runtime.RawExtension) (*batchv1.Job, *rawJob, error) {
	job, shape := &batchv1.Job{}, &rawJob{}
	if err := decodeInto(raw, "job", job, shape); err != nil {
		return nil, nil, err
	}
	return job, shape, nil
}
