package redislock

import (
	"context"
	"log/slog"
)

// releasedOne finishes a ReleaseCtx that gave back an acquisition of h
// that was not its last, or one of a hold that had ended with endErr.
// The caller holds rl.op.
func (rl *RedisLock) releasedOne(ctx context.Context, h *hold, endErr error) {
	rl.mu.Lock()
	releasing, inFlight := h.selfRelease, rl.locker.renewals.InFlight(h.renewal)
	lastOfEnded := endErr != nil && h.count == 0
	rl.mu.Unlock()
	switch {
	case endErr != nil && releasing != nil:
		// The watchdog is releasing the key of the hold it ended at
		// its maximum hold: return once it has.
		select {
		case <-releasing:
		case <-ctx.Done():
		}
	case lastOfEnded && inFlight:
		// A renewal sent before the hold ended is still in the
		// network: delete the key if it still holds our id, so that
		// the renewal finds nothing to extend once we return.
		if _, err := rl.release(ctx, h.id, 0); err != nil {
			rl.logHold(rl.locker.closedLevel(err, slog.LevelWarn), "redislock: release failed; the key expires with its lease", h, causeAttr(err))
		}
	}
}

// releaseLast deletes the key of h, whose last acquisition ReleaseCtx gave
// back (the hold has ended). The caller holds rl.op.
func (rl *RedisLock) releaseLast(ctx context.Context, h *hold) error {
	deleted, err := rl.release(ctx, h.id, 0)
	switch {
	case err != nil:
		rl.leftToExpire(h)
		rl.countEnd(h, nil)
		err = opErr("release", rl.key, err)
	case !deleted:
		// Someone deleted or took the key while we held it: a loss,
		// learnt only now. Done is closed already; Err reports it.
		err = rl.lostErr("release found the key gone or taken")
		rl.mu.Lock()
		h.err = err
		rl.mu.Unlock()
		rl.countEnd(h, err)
		rl.logHold(slog.LevelWarn, "redislock: hold lost", h, causeAttr(err))
	default:
		rl.countEnd(h, nil)
	}
	// A renewal in the network is not waited for: it is owner-checked, and
	// cannot bring back or extend the deleted key.
	return err
}

// releaseOf is ReleaseCtx of an acquisition of the hold of (any, if nil):
// it gives back none of another hold.
func (rl *RedisLock) releaseOf(ctx context.Context, of *hold) (bool, error) {
	if err := rl.check(ctx); err != nil {
		if ctx == nil && rl != nil && rl.err == nil && rl.op != nil {
			rl.giveBackNow(of) // a deferred ReleaseCtx(nil) leaves nothing renewing
		}
		return false, err
	}
	if err := rl.lockOp(ctx); err != nil {
		rl.giveBackNow(of)
		return false, opErr("release", rl.key, err)
	}
	defer rl.unlockOp()

	h, last, endErr := rl.giveBack(of)
	switch {
	case h == nil:
		return false, nil
	case last:
		err := rl.releaseLast(ctx, h)
		return err == nil, err
	}
	rl.releasedOne(ctx, h, endErr)
	return endErr == nil, endErr
}

// giveBackNow gives one acquisition back without a round trip: the last
// one ends the hold and stops its renewal, and the key expires with its
// lease.
func (rl *RedisLock) giveBackNow(of *hold) {
	if h, last, _ := rl.giveBack(of); last {
		rl.leftToExpire(h)
		rl.countEnd(h, nil)
	}
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
