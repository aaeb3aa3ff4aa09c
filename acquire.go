package redislock

import (
	"context"
	"time"

	"github.com/redislock/redislock/internal/renew"
	"github.com/redislock/redislock/internal/store"
)

// acquire makes a first acquisition within ctx, for a wait when waiting;
// the hold it begins has holding as its holding context. The caller holds
// rl.op.
func (rl *RedisLock) acquire(ctx, holding context.Context, lease time.Duration, waiting bool) (bool, time.Duration, error) {
	id := newID()
	sent := rl.locker.clock.Now()
	token, pttl, err := rl.mode.take(rl, ctx, id, lease, waiting)
	if err == nil && token < 0 {
		return false, pttl, nil // held by another owner
	}
	abandon, now := max(lease, abandonedFor), false
	switch {
	case err != nil && !store.Ambiguous(err):
		return false, 0, opErr("acquire", rl.key, err) // refused, or never sent: nothing to give back
	case err != nil:
		// The script may have run, its reply lost: the key may hold this
		// attempt's id, which nobody else has; or it may run later. Give
		// the id back, for good.
	case ctx.Err() != nil:
		// The caller gave up while the lock was being taken: give it back.
		err = context.Cause(ctx)
	default:
		if err = rl.beginHold(holding, id, lease, token, sent.Add(lease-renew.Margin(lease))); err == nil {
			return true, 0, nil
		}
		abandon, now = 0, true // the key may hold id yet
	}
	rl.letGo(ctx, id, lease, abandon, now)
	return false, 0, opErr("acquire", rl.key, err)
}

// plainMode is the mode of a lock.
var plainMode = &mode{take: (*RedisLock).attemptPlain, release: store.Release}

// attemptPlain runs acquire.lua for id. A wait's attempt keeps new shares
// of a shared lock out for a second (or its lease, if shorter), and the
// reply has it attempt again within a third of that.
func (rl *RedisLock) attemptPlain(ctx context.Context, id string, lease time.Duration, waiting bool) (int64, time.Duration, error) {
	args := []any{id, lease.Milliseconds()}
	if waiting {
		args = append(args, min(lease, time.Second).Milliseconds())
	}
	reply, err := rl.locker.store.Run(ctx, rl.waited(store.Acquire, lease), rl.names.acquire, args...)
	if err != nil {
		return 0, 0, err
	}
	return store.ParseAcquire(reply, rl.fenced())
}

// reenter counts one more acquisition of a live hold, as acquire. The
// caller holds rl.op.
func (rl *RedisLock) reenter(ctx, holding context.Context, h *hold) (bool, error) {
	sent := rl.locker.clock.Now()
	ok, err := rl.extend(ctx, h.id, h.lease)
	if err != nil {
		return false, opErr("re-enter", rl.key, err)
	}
	rl.mu.Lock()
	if !ok {
		err := rl.endLocked(h, rl.lostErr("re-entry found the key gone or taken"))
		rl.mu.Unlock()
		return false, err
	}
	if h.live() && !rl.locker.renewals.Extended(h.renewal, sent) {
		// Its end is being reported (a run of the scheduler found its
		// lease over): wait for it.
		rl.mu.Unlock()
		<-h.done
		rl.mu.Lock()
	}
	if !h.live() {
		// The hold ended while we were extending it: its lease ran out, its
		// maximum hold came, or its last acquisition was given back by a
		// ReleaseCtx with an ended context (no round trip, so no turn to
		// wait for). The key we just extended is no longer ours to keep.
		err := h.err
		rl.mu.Unlock()
		rl.letGo(ctx, h.id, h.lease, 0, true)
		if err != nil {
			return false, err
		}
		// Released: the release came first, so this is a first acquisition.
		lease := time.Duration(rl.expiry.Load())
		if err := validExpiry(lease); err != nil {
			return false, err
		}
		ok, _, err := rl.acquire(ctx, holding, lease, false)
		return ok, err
	}
	h.count++
	rl.mu.Unlock()
	return true, nil
}

// acquireCtx is AcquireCtx, also returning the holder's remaining lease when
// another owner holds the lock (negative when its key has no expiry); its
// round trips run within ctx, a hold it begins has holding; waiting says
// a wait makes it.
func (rl *RedisLock) acquireCtx(ctx, holding context.Context, waiting bool) (bool, time.Duration, error) {
	if err := rl.lockOp(ctx); err != nil {
		return false, 0, opErr("acquire", rl.key, err)
	}
	defer rl.unlockOp()

	if counting, ok, err := rl.reenterCounting(ctx, holding); counting {
		return ok, 0, err
	}
	if rl.lockerClosed() {
		return false, 0, opErr("acquire", rl.key, ErrLockerClosed)
	}

	lease := time.Duration(rl.expiry.Load())
	if err := validExpiry(lease); err != nil {
		return false, 0, err
	}
	ok, pttl, err := rl.acquire(ctx, holding, lease, waiting)
	rl.countAcquire(false, ok, err)
	return ok, pttl, err
}

// reenterCounting re-enters the hold of rl when it counts acquisitions, or
// returns why it ended when it is no longer live; counting is false when
// rl counts none. The caller holds rl.op.
func (rl *RedisLock) reenterCounting(ctx, holding context.Context) (counting, ok bool, err error) {
	rl.mu.Lock()
	h := rl.cur
	if h == nil || h.count == 0 {
		rl.mu.Unlock()
		return false, false, nil
	}
	live, endErr := h.live(), h.err
	rl.mu.Unlock()
	switch {
	case !live:
		err = endErr
	case rl.lockerClosed():
		return true, false, opErr("re-enter", rl.key, ErrLockerClosed)
	default:
		ok, err = rl.reenter(ctx, holding, h)
	}
	rl.countAcquire(true, ok, err)
	return true, ok, err
}

// extend verifies that id owns the key and refreshes its lease. It reports
// false, nil when the key does not hold id: a definite loss.
func (rl *RedisLock) extend(ctx context.Context, id string, lease time.Duration) (bool, error) {
	c := &store.Call{Script: rl.waited(rl.renewal(), lease), Keys: rl.names.renew, Args: []any{id, lease.Milliseconds()}}
	c.Reply, c.Err = rl.locker.store.Run(ctx, c.Script, c.Keys, c.Args...)
	codes, err := store.RenewalCodes(c, 1)
	if err != nil {
		return false, err
	}
	return codes[0] == 1, nil
}
