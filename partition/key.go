package partition

import (
	"crypto/sha256"
	"encoding/binary"
)

// KeyPartition returns the partition of key among n partitions (0 to n-1), as the SQL
// function pgcoord_key_partition computes it: jump consistent hash (Lamping and Veach,
// 2014) of the first 8 bytes of SHA-256 of key, read as a big-endian unsigned integer.
//
// Growing a group from n to n' partitions moves a key only from where it was to one of the
// new partitions n to n'-1, and moves about (n'-n)/n' of the keys; shrinking it moves the
// keys of the removed partitions only. A resize revokes every grant of the group before it
// grants any under the new count (see Resize), so no key is served under both counts at
// once. It returns -1 for n < 1.
func KeyPartition(key string, n int) int {
	if n < 1 {
		return -1
	}
	sum := sha256.Sum256([]byte(key))
	k := binary.BigEndian.Uint64(sum[:8])
	var b, j int64 = -1, 0
	for j < int64(n) {
		b = j
		k = k*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((k>>33)+1)))
	}
	return int(b)
}
