// Package keyslot computes Redis Cluster hash slots, as the server does.
package keyslot

import (
	"strconv"
	"strings"
	"sync"
)

// Tag returns what Redis Cluster hashes key by: its hash tag (the bytes
// between its first '{' and the first '}' after it, when there is at least
// one byte between them) and true; else key and false.
func Tag(key string) (string, bool) {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end], true
		}
	}
	return key, false
}

// Of returns the Redis Cluster slot of key: CRC16 (XMODEM) of its hash
// tag, or of the whole key when it has none, modulo 16384.
func Of(key string) uint16 {
	key, _ = Tag(key)
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

// tags caches TagFor's answers by slot.
var tags sync.Map

// TagFor returns the smallest number in base 36 whose slot is slot: about
// 16,000 hashes of 1 to 4 bytes the first time.
func TagFor(slot uint16) string {
	if tag, ok := tags.Load(slot); ok {
		return tag.(string)
	}
	for n := int64(0); ; n++ {
		if tag := strconv.FormatInt(n, 36); Of(tag) == slot {
			tags.Store(slot, tag)
			return tag
		}
	}
}
