package ledger

// KeepSnapshots is keepSnapshots for the external tests.
const KeepSnapshots = keepSnapshots

// SnapshotsSince is how many snapshots were taken after s.
func SnapshotsSince(s *Snapshot) uint64 {
	s.l.mu.RLock()
	defer s.l.mu.RUnlock()
	return s.l.snaps.seq - s.seq
}
