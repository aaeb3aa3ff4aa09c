package redislock

import (
	"context"

	"github.com/zeromicro/go-zero/core/logx"
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
			logx.Errorf("redislock: releasing %q (owner %s) after its hold ended failed, it expires with its lease: %s", rl.key, h.id, bare(err))
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
		logx.Errorf("redislock: hold of %q (owner %s) ended: %s", rl.key, h.id, bare(err))
	default:
		rl.countEnd(h, nil)
	}
	// A renewal in the network is not waited for: it is owner-checked, and
	// cannot bring back or extend the deleted key.
	return err
}
