package nodeagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// The toolkit settings that decide whether a container's environment can
// select GPUs. Both are top-level keys of the toolkit's config.toml.
const (
	// ToolkitKeyEnvvarWhenUnprivileged: with false, the toolkit ignores
	// NVIDIA_VISIBLE_DEVICES in unprivileged containers. The toolkit's
	// default is true.
	ToolkitKeyEnvvarWhenUnprivileged = "accept-nvidia-visible-devices-envvar-when-unprivileged"
	// ToolkitKeyVolumeMounts: with true, the toolkit reads the device list
	// from the /dev/null mounts below DeviceListMountRoot (the
	// volume-mounts strategy). The toolkit's default is false.
	ToolkitKeyVolumeMounts = "accept-nvidia-visible-devices-as-volume-mounts"
)

// ToolkitSettings are the toolkit's settings the node agent checks, with
// the toolkit's defaults where the file does not set them.
type ToolkitSettings struct {
	// EnvvarWhenUnprivileged is accept-nvidia-visible-devices-envvar-when-unprivileged.
	EnvvarWhenUnprivileged bool
	// VolumeMounts is accept-nvidia-visible-devices-as-volume-mounts.
	VolumeMounts bool
}

// ReadToolkitConfig reads the settings from the toolkit's config.toml at
// path. A file that does not exist is an error wrapping fs.ErrNotExist.
//
// Only the top-level keys above are read; everything else is skipped
// unparsed, so this is not a TOML validator. The module carries no TOML
// library, and these two keys are plain booleans before the file's first
// table header: a key outside a table, optionally quoted, `=`, true or
// false, and an optional # comment. A value that is not a boolean, or a
// key set twice, is an error naming the file, the line and the key.
func ReadToolkitConfig(path string) (ToolkitSettings, error) {
	s := ToolkitSettings{EnvvarWhenUnprivileged: true, VolumeMounts: false}
	b, err := os.ReadFile(path)
	if err != nil {
		return s, fmt.Errorf("NVIDIA container toolkit configuration: %w", err)
	}
	seen := map[string]int{}
	// multiline is the delimiter of the multi-line string or array a
	// top-level value opened ("" when none is open).
	multiline := ""
	for i, line := range strings.Split(string(b), "\n") {
		n := i + 1
		line = strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		if multiline != "" {
			if strings.Contains(line, multiline) {
				multiline = ""
			}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			// The first table header ends the top level: the keys wanted
			// are never in a table.
			break
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		key = unquoteKey(strings.TrimSpace(key))
		value = strings.TrimSpace(value)
		switch {
		case strings.HasPrefix(value, `"""`) && strings.Count(value, `"""`) == 1:
			multiline = `"""`
		case strings.HasPrefix(value, `'''`) && strings.Count(value, `'''`) == 1:
			multiline = `'''`
		case strings.HasPrefix(value, "[") && !strings.Contains(value, "]"):
			multiline = "]"
		}
		if key != ToolkitKeyEnvvarWhenUnprivileged && key != ToolkitKeyVolumeMounts {
			continue
		}
		if prev, dup := seen[key]; dup {
			return s, fmt.Errorf("%s:%d: %s is set twice (also on line %d)", path, n, key, prev)
		}
		seen[key] = n
		if c := strings.Index(value, "#"); c >= 0 {
			value = strings.TrimSpace(value[:c])
		}
		if value != "true" && value != "false" {
			return s, fmt.Errorf("%s:%d: %s = %s: not a boolean; want true or false", path, n, key, value)
		}
		v := value == "true"
		if key == ToolkitKeyEnvvarWhenUnprivileged {
			s.EnvvarWhenUnprivileged = v
		} else {
			s.VolumeMounts = v
		}
	}
	return s, nil
}

// unquoteKey strips the quotes of a TOML basic or literal key.
func unquoteKey(k string) string {
	if len(k) >= 2 && (k[0] == '"' && k[len(k)-1] == '"' || k[0] == '\'' && k[len(k)-1] == '\'') {
		return k[1 : len(k)-1]
	}
	return k
}

// Reasons of the environment isolation check, the reason label of
// gputopo_nodeagent_env_isolation.
const (
	// EnvIsolationEnvvarIgnored: the device list does not travel in the
	// environment (volume-mounts or cdi-cri) and the toolkit ignores
	// NVIDIA_VISIBLE_DEVICES in unprivileged containers. Isolated.
	EnvIsolationEnvvarIgnored = "envvar_ignored"
	// EnvIsolationEnvvarAccepted: the toolkit accepts
	// NVIDIA_VISIBLE_DEVICES from unprivileged containers (set so, or not
	// set: its default), so where the NVIDIA runtime or hook handles a
	// container, that container's env can select GPUs.
	EnvIsolationEnvvarAccepted = "envvar_accepted"
	// EnvIsolationEnvvarStrategy: the device list is only the envvar
	// strategy's NVIDIA_VISIBLE_DEVICES, which a container's own env
	// overrides.
	EnvIsolationEnvvarStrategy = "envvar_strategy"
	// EnvIsolationUnknown: the toolkit's configuration was not read (the
	// file is absent, or --toolkit-config is empty).
	EnvIsolationUnknown = "unknown"
	// EnvIsolationConfigError: the configuration could not be read or a
	// checked key is malformed.
	EnvIsolationConfigError = "config_error"
)

// EnvIsolationReasons are every reason, in the order above.
var EnvIsolationReasons = []string{EnvIsolationEnvvarIgnored, EnvIsolationEnvvarAccepted, EnvIsolationEnvvarStrategy, EnvIsolationUnknown, EnvIsolationConfigError}

// EnvIsolation is what the agent can tell at start about whether a
// container's environment (env, envFrom) can select GPUs on this node.
type EnvIsolation struct {
	// Isolated: the environment cannot select GPUs, as far as the
	// toolkit's configuration says. False also when unknown.
	Isolated bool
	// Reason is one of EnvIsolationReasons.
	Reason string
	// Path is the configuration file checked ("" when disabled).
	Path string
	// Settings are the toolkit's settings read (the toolkit's defaults
	// when not read).
	Settings ToolkitSettings
	// Err is why the configuration could not be read or parsed.
	Err error
}

// CheckEnvIsolation reads the toolkit's configuration at path (empty: no
// check) and judges it against the device list strategies. It never
// fails: a file that cannot be read or parsed gives the reason
// config_error and Err.
func CheckEnvIsolation(path string, strategies []configv1alpha1.DeviceListStrategy) EnvIsolation {
	r := EnvIsolation{Path: path, Settings: ToolkitSettings{EnvvarWhenUnprivileged: true}}
	if len(strategies) == 0 {
		strategies = []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListEnvvar}
	}
	envOnly := !slices.Contains(strategies, configv1alpha1.DeviceListVolumeMounts) && !slices.Contains(strategies, configv1alpha1.DeviceListCDICRI)
	if path != "" {
		s, err := ReadToolkitConfig(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if !envOnly {
				r.Reason = EnvIsolationUnknown
				return r
			}
		case err != nil:
			r.Err = err
			if !envOnly {
				r.Reason = EnvIsolationConfigError
				return r
			}
		default:
			r.Settings = s
		}
	} else if !envOnly {
		r.Reason = EnvIsolationUnknown
		return r
	}
	switch {
	case envOnly:
		r.Reason = EnvIsolationEnvvarStrategy
	case r.Settings.EnvvarWhenUnprivileged:
		r.Reason = EnvIsolationEnvvarAccepted
	default:
		r.Reason, r.Isolated = EnvIsolationEnvvarIgnored, true
	}
	return r
}

// log writes the outcome at start: what weakens isolation at V(0) (the
// structured form of a warning), an unknown outcome at V(1).
func (r EnvIsolation) log(logger klog.Logger, strategies []configv1alpha1.DeviceListStrategy) {
	kv := []any{"reason", r.Reason, "toolkitConfig", r.Path, "strategies", strategies}
	envvarKV := slices.Concat(kv, []any{"key", ToolkitKeyEnvvarWhenUnprivileged, "value", r.Settings.EnvvarWhenUnprivileged})
	switch r.Reason {
	case EnvIsolationEnvvarIgnored:
		logger.Info("Container environments cannot select GPUs: the device list does not travel in the environment and the NVIDIA container toolkit ignores NVIDIA_VISIBLE_DEVICES of unprivileged containers", envvarKV...)
	case EnvIsolationEnvvarAccepted:
		logger.Info("Warning: a container's environment can select GPUs: the NVIDIA container toolkit accepts NVIDIA_VISIBLE_DEVICES from unprivileged containers; set it false in the toolkit's configuration", envvarKV...)
	case EnvIsolationEnvvarStrategy:
		if r.Err == nil && !r.Settings.EnvvarWhenUnprivileged {
			logger.Info("Warning: GPU containers get no GPU: the envvar strategy names GPUs only in NVIDIA_VISIBLE_DEVICES, which the NVIDIA container toolkit ignores for unprivileged containers; use cdi-cri or volume-mounts", envvarKV...)
			return
		}
		logger.Info("Warning: any container's environment can select GPUs: the envvar strategy names GPUs in NVIDIA_VISIBLE_DEVICES, which a container's own env or envFrom overrides; use cdi-cri or volume-mounts with the toolkit setting false", kv...)
		if r.Err != nil {
			logger.Error(r.Err, "Reading the NVIDIA container toolkit configuration failed", "toolkitConfig", r.Path)
		}
	case EnvIsolationUnknown:
		if r.Path == "" {
			logger.V(1).Info("Environment isolation unknown: the NVIDIA container toolkit configuration is not checked (--toolkit-config is empty)", kv...)
		} else {
			logger.V(1).Info("Environment isolation unknown: no NVIDIA container toolkit configuration at this path", kv...)
		}
	case EnvIsolationConfigError:
		logger.Error(r.Err, "Environment isolation unknown: reading the NVIDIA container toolkit configuration failed; the agent runs on", kv...)
	}
	if slices.Contains(strategies, configv1alpha1.DeviceListVolumeMounts) && r.Err == nil && !r.Settings.VolumeMounts && r.Reason != EnvIsolationUnknown {
		logger.Info("Warning: the volume-mounts strategy needs the NVIDIA container toolkit to read the device list from volume mounts; set it true",
			"toolkitConfig", r.Path, "key", ToolkitKeyVolumeMounts, "value", r.Settings.VolumeMounts)
	}
}
