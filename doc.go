// Package redislock is a distributed, reentrant, self-renewing mutual
// exclusion lock on Redis, shaped like go-zero's redis.RedisLock.
//
// A lock is one Redis string key holding its owner's random id, taken with
// SET NX PX and deleted by an owner-checked script, so it interoperates with
// go-zero's RedisLock and the classic recipe. On top of that, a RedisLock
// counts re-entries, renews its lease in the background while held, and
// tells its holder at once, through Done and Err, when the hold ends for any
// reason other than its own Release.
package redislock
