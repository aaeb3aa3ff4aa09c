package redislock

import "strings"

// sameSlot returns a name for something that belongs with key (a pub/sub
// channel, a counter) that a Redis Cluster hashes to key's slot: key and
// suffix when key has a hash tag, else key wrapped in braces and suffix.
// A key with a '}' and no hash tag ("a}b", "a{}b") cannot be wrapped so:
// its names land in another slot, and on Redis Cluster a script that uses
// both fails with CROSSSLOT.
func sameSlot(key, suffix string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key + suffix // the tag stays the first one
		}
	}
	return "{" + key + "}" + suffix
}
