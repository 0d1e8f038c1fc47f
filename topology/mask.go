package topology

import (
	"fmt"
	"math/bits"
)

// maskWords is the number of 64-bit words in a Mask.
const maskWords = MaxGPUs / 64

// Mask is a set of GPU indices 0..MaxGPUs-1. The zero Mask is empty. Masks
// are values: every operation returns a new one, and == compares them.
type Mask struct {
	w [maskWords]uint64
}

// MaskOf is the set of the given indices; indices outside 0..MaxGPUs-1 are
// ignored.
func MaskOf(indices ...int) Mask {
	var m Mask
	for _, i := range indices {
		if i >= 0 && i < MaxGPUs {
			m.w[i>>6] |= 1 << (i & 63)
		}
	}
	return m
}

// firstN is the set {0..n-1}.
func firstN(n int) Mask {
	var m Mask
	for i := range maskWords {
		switch lo := i * 64; {
		case n >= lo+64:
			m.w[i] = ^uint64(0)
		case n > lo:
			m.w[i] = 1<<(n-lo) - 1
		}
	}
	return m
}

// Count is the number of GPUs in the set.
func (m Mask) Count() int {
	c := 0
	for _, w := range m.w {
		c += bits.OnesCount64(w)
	}
	return c
}

// Equal reports whether m and o hold the same GPUs (as == does; go-cmp
// uses it).
func (m Mask) Equal(o Mask) bool { return m == o }

// Word is the set's i-th 64-bit word, GPUs 64i..64i+63 as bits (0 past the
// last word): for hashing a set.
func (m Mask) Word(i int) uint64 {
	if i < 0 || i >= maskWords {
		return 0
	}
	return m.w[i]
}

// Empty reports whether the set has no GPU.
func (m Mask) Empty() bool { return m == Mask{} }

// Has reports whether GPU i is in the set.
func (m Mask) Has(i int) bool {
	return i >= 0 && i < MaxGPUs && m.w[i>>6]&(1<<(i&63)) != 0
}

// With is the set plus GPU i (i outside 0..MaxGPUs-1 is ignored).
func (m Mask) With(i int) Mask {
	if i >= 0 && i < MaxGPUs {
		m.w[i>>6] |= 1 << (i & 63)
	}
	return m
}

// Union is the GPUs in m or o.
func (m Mask) Union(o Mask) Mask {
	for i := range m.w {
		m.w[i] |= o.w[i]
	}
	return m
}

// Intersect is the GPUs in both m and o.
func (m Mask) Intersect(o Mask) Mask {
	for i := range m.w {
		m.w[i] &= o.w[i]
	}
	return m
}

// Minus is the GPUs in m and not in o.
func (m Mask) Minus(o Mask) Mask {
	for i := range m.w {
		m.w[i] &^= o.w[i]
	}
	return m
}

// Indices lists the set's GPU indices in increasing order.
func (m Mask) Indices() []int {
	out := make([]int, 0, m.Count())
	for i, w := range m.w {
		for ; w != 0; w &= w - 1 {
			out = append(out, i*64+bits.TrailingZeros64(w))
		}
	}
	return out
}

// String renders the set as "{0,3,4}".
func (m Mask) String() string {
	b := []byte{'{'}
	for i, v := range m.Indices() {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%d", v)
	}
	return string(append(b, '}'))
}

// Bitset is a set of GPU indices over a graph of at most WindowGPUs GPUs,
// the form set searches (the allocator, the metrics) work in: bit i set
// means GPU i is in the set. It is one machine word so that the inner
// loops stay single instructions.
type Bitset uint64

// WindowGPUs is the most GPUs a Bitset holds: the largest graph a set
// search works on directly. A larger graph is seen through windows of at
// most WindowGPUs of its GPUs (Graph.Window).
const WindowGPUs = 64

// Bitset is the Bitset of m's GPUs 0..WindowGPUs-1 (all of m on a graph of
// at most WindowGPUs GPUs).
func (m Mask) Bitset() Bitset { return Bitset(m.w[0]) }

// Mask is b as a Mask.
func (b Bitset) Mask() Mask {
	var m Mask
	m.w[0] = uint64(b)
	return m
}

// Count is the number of GPUs in the set.
func (b Bitset) Count() int { return bits.OnesCount64(uint64(b)) }

// Has reports whether GPU i is in the set.
func (b Bitset) Has(i int) bool { return i >= 0 && i < WindowGPUs && b&(1<<i) != 0 }

// Indices lists the set's GPU indices in increasing order.
func (b Bitset) Indices() []int {
	out := make([]int, 0, b.Count())
	for r := b; r != 0; r &= r - 1 {
		out = append(out, bits.TrailingZeros64(uint64(r)))
	}
	return out
}

// String renders the set as "{0,3,4}".
func (b Bitset) String() string { return b.Mask().String() }

// Combinations calls f with every k-combination of 0..n-1, as strictly
// increasing positions in lexicographic order, until f returns false; pos
// is reused between calls. Nothing is called for k < 1 or k > n.
func Combinations(n, k int, f func(pos []int) bool) {
	if k < 1 || k > n {
		return
	}
	pos := make([]int, k)
	for i := range pos {
		pos[i] = i
	}
	for f(pos) {
		i := k - 1
		for i >= 0 && pos[i] == n-k+i {
			i--
		}
		if i < 0 {
			return
		}
		pos[i]++
		for j := i + 1; j < k; j++ {
			pos[j] = pos[j-1] + 1
		}
	}
}
