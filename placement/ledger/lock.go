package ledger

import "sync"

// readStripes is how many reader locks the ledger's lock spreads readers
// over (a power of two).
const readStripes = 8

// stripedLock is a readers-writer lock whose readers spread over
// readStripes locks, each on its own cache line, and whose writers take
// them all. The scheduling framework filters nodes from 16 goroutines and
// each asks the ledger about one node: with one lock, every read would
// contend on one reader count; writes (informer events, reservations) are
// rare by comparison.
type stripedLock struct {
	stripes [readStripes]struct {
		sync.RWMutex
		_ [40]byte // pad to a 64-byte cache line
	}
}

// Lock takes every stripe, in order.
func (s *stripedLock) Lock() {
	for i := range s.stripes {
		s.stripes[i].Lock()
	}
}

// Unlock releases every stripe.
func (s *stripedLock) Unlock() {
	for i := range s.stripes {
		s.stripes[i].Unlock()
	}
}

// RLock takes stripe 0 for reading.
func (s *stripedLock) RLock() { s.stripes[0].RLock() }

// RUnlock releases stripe 0.
func (s *stripedLock) RUnlock() { s.stripes[0].RUnlock() }

// stripeOf spreads keys over the lock's stripes by their last eight
// bytes (node names of one cluster differ at the end: gpu-node-0042); a
// reader of one node takes stripe stripeOf(node).
func stripeOf(key string) int {
	h := uint32(2166136261)
	for i := max(len(key)-8, 0); i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return int(h & (readStripes - 1))
}
