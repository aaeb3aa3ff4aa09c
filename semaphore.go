package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redislock/redislock/internal/store"
)

// Semaphores and shared locks: the key is a string naming its kind, which
// every other lock sees held, and its holders are a sorted set in a related
// key, each with the end of its own lease by the server's clock
// (internal/store/holders.lua). A holder is a hold like a lock's: the same
// renewals, re-entries, releases and losses, through the same scripts
// (renewals through their own), which tell the kinds apart by the key's
// value.

// ErrWrongKind reports that a key is used as another kind of lock than the
// call's: a semaphore and a lock, a semaphore and a shared lock,
// semaphores of different numbers of permits, or, for a semaphore or a
// shared lock, a key of another type that someone else wrote. Nothing was
// changed in Redis.
var ErrWrongKind = store.ErrWrongKind

// MaxPermits is the most permits a semaphore can have.
const MaxPermits = 1<<31 - 1

// ErrInvalidPermits reports a number of permits outside [1, MaxPermits]
// (WithPermits), or WithPermits given with WithShared.
var ErrInvalidPermits = errors.New("redislock: invalid permits")

// WithPermits makes the RedisLock a holder of one of the n permits of its
// key: up to n RedisLock values, in any processes, hold the key at once,
// each with its own lease, renewals and re-entries as a lock's holder has;
// the next is refused (Acquire) or waits (AcquireWait, Do); with
// WithFairness, a freed permit goes to the longest waiter. Every holder
// of the key must be made with the same n. An n outside [1, MaxPermits] is
// reported as ErrInvalidPermits by the first call. See docs/semaphores.md.
func WithPermits(n int) Option {
	return func(o *options) {
		if o.judge("WithPermits", n < 1 || n > MaxPermits, func() error {
			return fmt.Errorf("%w: WithPermits(%d) must lie in [1, %d]", ErrInvalidPermits, n, MaxPermits)
		}) {
			o.permits = n
		}
	}
}

// WithShared makes the RedisLock hold its key shared: any number of shared
// holders at once, and none while an exclusive holder holds it (a
// RedisLock without WithShared, go-zero's RedisLock, any SET NX of the
// key). An exclusive holder that waits for the key in AcquireWait or Do
// is let in before shares asked for after it; with WithFairness, the
// waits of the key's fair locks, shared and exclusive, are served in
// arrival order, and consecutive waiters for a share are let in together.
// See docs/semaphores.md.
func WithShared() Option {
	return func(o *options) { o.shared = true }
}

// permitMode is the mode of semaphores and shared locks.
var permitMode = &mode{take: (*RedisLock).attemptPermit, release: store.Release}

// renewal returns the script that renews rl's holds, of its names.renew.
func (rl *RedisLock) renewal() *store.Script {
	if len(rl.names.renew) > 1 {
		return store.ExtendHolders
	}
	return store.Extend
}

// attemptPermit runs permit_acquire.lua for id.
func (rl *RedisLock) attemptPermit(ctx context.Context, id string, lease time.Duration, _ bool) (int64, time.Duration, error) {
	reply, err := rl.locker.store.Run(ctx, rl.waited(store.PermitAcquire, lease), rl.names.acquire, id, lease.Milliseconds(), rl.opts.permits)
	if err != nil {
		return 0, 0, err
	}
	return store.ParseAcquire(reply, rl.fenced())
}

// permitsErr checks the options of a semaphore or a shared lock.
func permitsErr(o options) error {
	if o.permits > 0 && o.shared {
		return fmt.Errorf("%w: WithPermits(%d) with WithShared", ErrInvalidPermits, o.permits)
	}
	return nil
}
