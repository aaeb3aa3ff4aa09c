package redislock

import "strings"

// relatedName returns the name of something that belongs with key (its
// fencing counter, its release marker, its pub/sub channel) that a Redis
// Cluster hashes to key's slot, and that no other key's names can equal:
//
//   - a key with a hash tag ("{user:1}:lock") keeps it: key + "#redislock:" + kind;
//   - any other key is wrapped in braces: "{" + key + "}:redislock:" + kind.
//
// The two forms end differently ("#" against "}:" before "redislock:"),
// so "k" and "{k}", or "a}b" and "{a}b}", never share a name. A key with a
// '}' and no hash tag ("a}b", "a{}b") cannot be wrapped into its own slot:
// its names land in another, and on Redis Cluster a script that uses both
// fails with CROSSSLOT.
func relatedName(key, kind string) string {
	if hasHashTag(key) {
		return key + "#redislock:" + kind
	}
	return "{" + key + "}:redislock:" + kind
}

// hasHashTag reports whether Redis Cluster hashes key by a hash tag: a '{'
// followed later by a '}' with at least one byte between them.
func hasHashTag(key string) bool {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return true
		}
	}
	return false
}
