package redislock

import (
	"context"
	"errors"
)

// Do runs fn while holding the lock: it waits for it as AcquireWait does
// (giving up without calling fn), calls fn with a context derived from ctx
// that is also cancelled, with the reason as its cause (ErrLockLost,
// ErrMaxHoldExceeded), as soon as the hold ends for any reason but Do's own
// release, and releases the lock as soon as fn returns or panics. It
// returns fn's error, joined with the reason the hold ended if it ended
// while fn ran, and the release's error if it failed. A Do inside a Do of
// the same RedisLock re-enters it, and gives back only its own
// acquisition. See docs/semantics.md.
func (rl *RedisLock) Do(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	if err := rl.check(ctx); err != nil {
		return err
	}
	if fn == nil {
		return ErrNilFunc
	}
	if err := rl.AcquireWait(ctx); err != nil {
		return err
	}
	rl.mu.Lock()
	h := rl.cur
	rl.mu.Unlock()
	life := rl.lifeOf(h)
	held, span := rl.startHold(ctx, h)
	work, cancel := context.WithCancelCause(held)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	defer func() {
		stop()
		cancel(nil)
		err = errors.Join(err, rl.releaseDetached(ctx, h))
		rl.endHold(span, h)
	}()
	if life.Err() != nil {
		return nil // the hold is over already: the release reports why
	}
	return fn(work)
}
