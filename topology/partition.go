package topology

// PartitionBy splits items into parts of equal key, each part in items'
// order and the parts in the order of their first item: GPUs by their
// domain at a level, nodes by their fabric domain.
func PartitionBy[K comparable](items []int, key func(int) K) [][]int {
	at := map[K]int{}
	var out [][]int
	for _, i := range items {
		k := key(i)
		p, ok := at[k]
		if !ok {
			p = len(out)
			at[k] = p
			out = append(out, nil)
		}
		out[p] = append(out[p], i)
	}
	return out
}
