// Package redislock is a distributed, reentrant, self-renewing mutual
// exclusion lock on Redis, shaped like go-zero's redis.RedisLock.
//
// Work under a lock with Do: it waits for the lock, runs fn with a context
// that ends if the lock is lost, and releases the lock when fn returns:
//
//	lock := redislock.NewRedisLock(redislock.FromGoRedis(rdb), "invoice:42") // or go-zero's *redis.Redis
//	err := lock.Do(ctx, func(ctx context.Context) error {
//		return charge(ctx) // stop when ctx ends: context.Cause(ctx) says why
//	})
//
// A lock is one Redis string key holding its owner's random id, taken with
// SET NX PX and deleted by an owner-checked script, so it interoperates with
// go-zero's RedisLock and the classic recipe. On top of that, a RedisLock
// counts re-entries, renews its lease in the background while held, and
// tells its holder at once, through Done and Err, when the hold ends for any
// reason other than its own Release.
//
// A Locker (NewLocker) makes the locks of one client and owns what they
// share: defaults, a key namespace, batched renewals and wake-ups, and
// their lifetime. Inspect, Break and Watch let operators see and break a
// lock without holding it; the redislock command (cmd/redislock) wraps
// them, and runs shell commands under a lock.
//
// # Fair locks
//
// With WithFairness, the waiters of AcquireWait and Do queue in Redis (a
// sorted set in the key's hash slot, ordered by a server-side sequence),
// and a release hands the lock to the first waiter that is still live: it
// sets the key to that waiter's id and publishes it, and the waiter holds
// the lock from the moment it hears, without a round trip of its own. Each
// waiter stays live by attempting at least every lease/3; a waiter whose
// process died lapses after one lease and is skipped. A waiter that gives
// up leaves the queue, and passes the lock on if it was handed to it
// meanwhile. AcquireCtx on a fair lock never queues, and takes a free key
// only when no live waiter is queued. Locks without WithFairness,
// go-zero's RedisLock and SET NX PX are still excluded, but do not queue:
// they may take the key while it is free, which happens only when no fair
// waiter is live, or after their own release.
package redislock
