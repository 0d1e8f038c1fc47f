package machine

import (
	"fmt"
	"strings"
)

// The GPU catalogue: what the importers know of GPU products that their
// inputs do not say (a product's NVLink generation, memory and PCIe
// generation), and the figures of each NVLink generation.

// GPUKind is what the importer knows of a GPU product that
// `nvidia-smi topo -m` does not print: its NVLink generation (and so the
// bandwidth of one link), memory and PCIe generation.
type GPUKind struct {
	// Key is the --gpu value and the text matched in a product name.
	Key       string
	Model     string
	NVLinkGen int
	MemoryMiB int64
	PCIeGen   int
}

// gpuKinds is ordered so that the first key found in a product name is the
// right one ("a100" before "a10", "h100" before "h10").
var gpuKinds = []GPUKind{
	{"gb200", "NVIDIA GB200", 5, 189471, 5},
	{"b200", "NVIDIA B200", 5, 183359, 5},
	{"h200", "NVIDIA H200", 4, 143771, 5},
	{"h100", "NVIDIA H100 80GB HBM3", 4, 81559, 5},
	{"h800", "NVIDIA H800", 4, 81559, 5},
	{"h20", "NVIDIA H20", 4, 97871, 5},
	{"a100", "NVIDIA A100-SXM4-40GB", 3, 40960, 4},
	{"a800", "NVIDIA A800-SXM4-80GB", 3, 81920, 4},
	{"a30", "NVIDIA A30", 3, 24576, 4},
	{"a40", "NVIDIA A40", 3, 46068, 4},
	{"a6000", "NVIDIA RTX A6000", 3, 49140, 4},
	{"3090", "NVIDIA GeForce RTX 3090", 3, 24576, 4},
	{"v100", "Tesla V100-SXM2-16GB", 2, 16384, 3},
	{"p100", "Tesla P100-SXM2-16GB", 1, 16384, 3},
	{"l40s", "NVIDIA L40S", 0, 46068, 4},
	{"l40", "NVIDIA L40", 0, 46068, 4},
	{"a10", "NVIDIA A10", 0, 23028, 4},
	{"l4", "NVIDIA L4", 0, 23034, 4},
	{"t4", "Tesla T4", 0, 15360, 3},
	{"k80", "Tesla K80", 0, 11441, 3},
	{"4090", "NVIDIA GeForce RTX 4090", 0, 24564, 4},
	{"5090", "NVIDIA GeForce RTX 5090", 0, 32607, 5},
}

// GPUKinds lists the --gpu values the importer knows, in match order.
func GPUKinds() []GPUKind { return append([]GPUKind(nil), gpuKinds...) }

// GPUKindByKey finds a kind by its --gpu key (case-insensitive).
func GPUKindByKey(key string) (GPUKind, error) {
	var keys []string
	for _, k := range gpuKinds {
		if strings.EqualFold(k.Key, strings.TrimSpace(key)) {
			return k, nil
		}
		keys = append(keys, k.Key)
	}
	return GPUKind{}, fmt.Errorf("gpu %q: unknown; known GPUs are %s", key, strings.Join(keys, ", "))
}

// GPUKindOfName finds the kind of an NVML product name such as
// "NVIDIA A100-SXM4-80GB"; false when none matches.
func GPUKindOfName(name string) (GPUKind, bool) {
	l := strings.ToLower(name)
	for _, k := range gpuKinds {
		if strings.Contains(l, k.Key) {
			return k, true
		}
	}
	return GPUKind{}, false
}

func nvlinkKeys() string {
	var keys []string
	for _, k := range gpuKinds {
		if k.NVLinkGen > 0 {
			keys = append(keys, k.Key)
		}
	}
	return strings.Join(keys, ", ")
}

// NVLink bandwidth per link, GB/s bidirectional, by NVLink generation
// (NVIDIA's published figures).
var nvlinkGBpsPerLink = map[int]int{1: 40, 2: 50, 3: 50, 4: 50, 5: 100}

// NVLinkGBpsPerLink is the bandwidth of one NVLink of generation gen, GB/s
// bidirectional; 0 for an unknown generation.
func NVLinkGBpsPerLink(gen int) int { return nvlinkGBpsPerLink[gen] }

// maxNVLinksPerGPU is the most NVLinks one GPU of each generation has.
var maxNVLinksPerGPU = map[int]int{1: 4, 2: 6, 3: 12, 4: 18, 5: 18}
