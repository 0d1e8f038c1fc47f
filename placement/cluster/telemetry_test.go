package cluster

import (
	"testing"
)

func TestToInt32(t *testing.T) {
	for in, want := range map[float64]int32{87.4: 87, 87.5: 88, -3: -3, 1e12: 1<<31 - 1} {
		if got := toInt32(in); got != want {
			t.Errorf("toInt32(%v) = %d, want %d", in, got, want)
		}
	}
}
