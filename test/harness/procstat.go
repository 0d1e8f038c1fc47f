package harness

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ProcessCPU is the CPU time (user + system) of the running processes
// whose executable is bin/<name> for one of names, from /proc.
func ProcessCPU(names ...string) time.Duration {
	var total time.Duration
	for _, pid := range procs(names...) {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command (which may hold spaces) in ")".
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}
	return total
}

// procs are the processes whose executable is bin/<name> for one of
// names.
func procs(names ...string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || !slices.Contains(names, filepath.Base(exe)) || filepath.Dir(exe) != BinDir() {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// PeakRSS is the largest peak resident memory (VmHWM, bytes) of the
// running processes named as for ProcessCPU.
func PeakRSS(names ...string) int64 {
	var peak int64
	for _, pid := range procs(names...) {
		st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				peak = max(peak, kb<<10)
			}
		}
	}
	return peak
}
