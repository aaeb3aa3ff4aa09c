package redislock

import "crypto/rand"

// newID returns a fresh owner id: 26 base32 characters carrying 130 random
// bits from crypto/rand, unique to one hold.
func newID() string {
	return rand.Text()
}
