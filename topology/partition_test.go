package topology

import (
	"slices"
	"testing"
)

func TestPartitionByKeepsOrder(t *testing.T) {
	got := PartitionBy([]int{5, 2, 7, 4, 1, 8}, func(i int) int { return i % 3 })
	want := [][]int{{5, 2, 8}, {7, 4, 1}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("PartitionBy = %v, want %v (parts in order of their first item, items in order)", got, want)
	}
	if got := PartitionBy(nil, func(i int) int { return i }); len(got) != 0 {
		t.Errorf("PartitionBy(nil) = %v, want no parts", got)
	}
}
