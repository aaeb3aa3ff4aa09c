package redislock

import (
	"slices"
	"strings"

	"github.com/redislock/redislock/internal/keyslot"
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
	switch _, tagged := keyslot.Tag(key); {
	case tagged:
		return key + "#redislock:" + kind
	case strings.IndexByte(key, '}') >= 0:
		return "{" + keyslot.TagFor(keyslot.Of(key)) + "}~" + key + "~redislock:" + kind
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
		!slices.Contains([]string{"fence", "abandoned", "queue", "waiters", "broken", "releases", "leader", "holders"}, kind) {
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
