package redislock

import (
	"slices"
	"strconv"
	"strings"
	"sync"
)

// relatedName returns the name of something that belongs with key (its
// fencing counter, its release marker, its pub/sub channel) that a Redis
// Cluster hashes to key's slot, and that no other key's names can equal:
//
//   - a key with a hash tag ("{user:1}:lock") keeps it: key + "#redislock:" + kind;
//   - a key with a '}' and no hash tag ("a}b", "{}x") cannot be wrapped in
//     braces of its own: its names take as hash tag the shortest base-36
//     number that hashes to key's slot: "{" + tag + "}~" + key + "~redislock:" + kind;
//   - any other key is wrapped in braces: "{" + key + "}:redislock:" + kind.
//
// The three forms differ in the byte before the last "redislock:" ('#',
// '~', ':'), which no kind contains, and each form gives back its key, so
// no two keys share a name ("k" and "{k}", "a}b" and "{a}b}" do not).
func relatedName(key, kind string) string {
	switch _, tagged := hashTag(key); {
	case tagged:
		return key + "#redislock:" + kind
	case strings.IndexByte(key, '}') >= 0:
		return "{" + slotTag(clusterSlot(key)) + "}~" + key + "~redislock:" + kind
	}
	return "{" + key + "}:redislock:" + kind
}

// reservedKey reports whether key is the name of one of another key's
// related keys (see relatedName), which that key's lock writes.
func reservedKey(key string) bool {
	i := strings.LastIndex(key, "redislock:")
	if i < 1 {
		return false
	}
	kind, p := key[i+len("redislock:"):], key[:i]
	if id, marker := strings.CutPrefix(kind, "release:"); (!marker || id == "") &&
		!slices.Contains([]string{"fence", "abandoned", "queue", "waiters", "broken"}, kind) {
		return false
	}
	others := []string{p[:len(p)-1], strings.TrimSuffix(strings.TrimPrefix(p, "{"), "}:")} // the tagged form, the plain
	if _, other, ok := strings.Cut(p, "}~"); ok {
		others = append(others, strings.TrimSuffix(other, "~")) // the form of a key with a stray '}'
	}
	for _, other := range others {
		if other != "" && relatedName(other, kind) == key {
			return true
		}
	}
	return false
}

// hashTag returns what Redis Cluster hashes key by: its hash tag (the bytes
// between its first '{' and the first '}' after it, when there is at least
// one byte between them) and true; else key and false.
func hashTag(key string) (string, bool) {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end], true
		}
	}
	return key, false
}

// clusterSlot is the Redis Cluster slot of key: CRC16 (XMODEM) of its hash
// tag, or of the whole key when it has none, modulo 16384.
func clusterSlot(key string) uint16 {
	key, _ = hashTag(key)
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc & 16383
}

// slotTags caches slotTag's answers by slot.
var slotTags sync.Map

// slotTag returns the smallest number in base 36 whose slot is slot: about
// 16,000 hashes of 1 to 4 bytes the first time, for keys with a stray '}'.
func slotTag(slot uint16) string {
	if tag, ok := slotTags.Load(slot); ok {
		return tag.(string)
	}
	for n := int64(0); ; n++ {
		if tag := strconv.FormatInt(n, 36); clusterSlot(tag) == slot {
			slotTags.Store(slot, tag)
			return tag
		}
	}
}
