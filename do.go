package redislock

import (
	"context"
	"errors"
)

// Do runs fn while holding the lock: the safe way to do work under it.
//
// It waits for the lock as AcquireWait does: ctx (and WithWaitTimeout)
// bound the wait, and when Do gives up it returns an error matching
// ErrNotAcquired and ctx.Err() without calling fn. Otherwise it calls fn
// with a context derived from ctx that is also cancelled as soon as the
// hold ends for any reason other than Do's own release, with that reason as
// its cause: context.Cause matches ErrLockLost or ErrMaxHoldExceeded. fn
// must stop its work when its context ends.
//
// When fn returns, or panics, Do releases the lock at once (and the panic
// goes on); when ctx ends while fn runs, fn's context is cancelled and the
// release follows fn's return, without waiting for the lease to run out.
// Do returns fn's error, joined with the reason the hold ended if it ended
// while fn ran, and with the release's error if the release failed (the
// key then expires with its lease). If the hold ends before fn could be
// called, fn is not called and Do returns the reason.
//
// Called inside a Do of the same RedisLock, Do re-enters the lock, and its
// release gives back that one acquisition. Should another call release
// the hold Do took (a misuse), fn's context ends with a cause that matches
// neither sentinel, and Do gives back nothing of a hold taken after it.
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
	work, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	defer func() {
		stop()
		cancel(nil)
		err = errors.Join(err, rl.releaseDetached(ctx, h))
	}()
	if life.Err() != nil {
		return nil // the hold is over already: the release reports why
	}
	return fn(work)
}

// releaseDetached gives back one acquisition of h (of the current hold if
// nil), as ReleaseCtx, within selfReleaseTimeout whatever ctx does: the
// last one's release hands a fair lock on to its next waiter.
func (rl *RedisLock) releaseDetached(ctx context.Context, h *hold) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), selfReleaseTimeout)
	defer cancel()
	_, err := rl.releaseOf(ctx, h)
	return err
}
