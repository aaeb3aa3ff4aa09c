package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

// firstDuty returns when the watchdog of h has its first work: the first
// renewal, or the maximum hold; zero when it has none (no watchdog, no
// maximum hold).
func (rl *RedisLock) firstDuty(h *hold) time.Time {
	var at time.Time
	if rl.watchdog {
		at = h.started.Add(h.lease / 3)
	}
	if rl.maxHold > 0 {
		if maxAt := h.started.Add(rl.maxHold); at.IsZero() || maxAt.Before(at) {
			at = maxAt
		}
	}
	return at
}

// watch is one run of the watchdog of h: it runs in the calling goroutine (a
// timer's, or the one that reports the end of the holding context), does
// the duties that are due, arms h.wake for the next ones, and returns. A
// held lock costs no goroutine between duties. Runs never overlap, and none
// starts once the hold has ended. Ending a hold cancels the round trip of a
// run under way; h.run is closed when that run is over.
//
// Loss by a lease that ran out is not its job: h.timer ends the hold at the
// deadline even while a renewal is stuck in the network, because go-redis
// does not cut a read short when a context ends.
func (rl *RedisLock) watch(h *hold) {
	rl.mu.Lock()
	if h.run != nil || !h.live() { // running, or nothing to do
		rl.mu.Unlock()
		return
	}
	if h.cancelRenew == nil { // the first run
		h.renewCtx, h.cancelRenew = context.WithCancel(h.parent)
		h.nextRenew = h.started.Add(h.lease / 3)
	}
	run := make(chan struct{})
	h.run = run
	rl.mu.Unlock()

	next := rl.duties(h)
	rl.mu.Lock()
	h.run = nil
	close(run)
	if h.live() && !next.IsZero() {
		d := next.Sub(rl.clock.Now())
		if h.wake == nil {
			h.wake = rl.clock.WatchFunc(d, func() { rl.watch(h) })
		} else {
			h.wake.Reset(d)
		}
	}
	rl.mu.Unlock()
}

// duties renews the lease of h when a renewal is due (unless
// WithoutWatchdog, or after the holding context ended), and ends the hold
// at the maximum hold. It returns when the next duty is due, or zero when
// there is none. A call before anything is due does nothing, so a spurious
// wake-up costs no round trip.
func (rl *RedisLock) duties(h *hold) (next time.Time) {
	interval := h.lease / 3
	maxAt := h.started.Add(rl.maxHold)
	for {
		rl.mu.Lock()
		state := h.state
		rl.mu.Unlock()
		if state == ended {
			return time.Time{}
		}
		renews := rl.watchdog && state == renewing
		now := rl.clock.Now()
		if rl.maxHold > 0 && !now.Before(maxAt) {
			rl.endAndRelease(h, fmt.Errorf("%w: %q held for %v", ErrMaxHoldExceeded, rl.key, rl.maxHold))
			return time.Time{}
		}
		if renews && !now.Before(h.nextRenew) {
			ok, err := rl.renew(h, now)
			switch {
			case err == nil && ok:
				h.failures = 0
				h.nextRenew = now.Add(interval)
			case err == nil: // definite loss, or the hold ended meanwhile
				return time.Time{}
			case h.renewCtx.Err() != nil: // the hold or its holding context ended
			default:
				h.failures++
				backoff := retryBackoff(interval, h.failures)
				h.nextRenew = now.Add(backoff)
				logx.Errorf("redislock: renewing %q (owner %s) failed, attempt %d, retrying in %v: %v",
					rl.key, h.id, h.failures, backoff, err)
			}
			continue
		}

		if renews {
			next = h.nextRenew
		}
		if rl.maxHold > 0 && (next.IsZero() || maxAt.Before(next)) {
			next = maxAt
		}
		return next
	}
}

// renew extends h's lease once. It reports true, nil when the hold goes on;
// false, nil when the hold is over (the key is gone or taken, or the hold
// ended while the renewal was under way); and the error of a renewal that
// did not get through, which the caller retries until the lease runs out.
func (rl *RedisLock) renew(h *hold, sent time.Time) (bool, error) {
	rl.mu.Lock()
	timeout := h.until.Sub(sent)
	rl.mu.Unlock()
	ctx, cancel := context.WithTimeout(h.renewCtx, max(timeout, time.Millisecond))
	ok, err := rl.extend(ctx, h.id, h.lease)
	cancel()
	switch {
	case err != nil:
		metricRenewals.Inc("failed")
	case ok:
		metricRenewals.Inc("ok")
	default:
		metricRenewals.Inc("lost")
	}

	rl.mu.Lock()
	switch {
	case !h.live() && ok && h.err != nil:
		// Ended while this renewal was in the network (its lease ran
		// out, or its maximum hold), yet it got through: the key carries
		// our id again, and nobody will use it. (After a release, the
		// release deletes the key whatever the order.)
		rl.mu.Unlock()
		rl.releaseQuietly(h.parent, h.id, h.lease)
		return false, nil
	case !h.live():
		rl.mu.Unlock()
		return false, nil
	case err != nil:
		h.lastErr = err
		rl.mu.Unlock()
		return false, err
	case !ok:
		rl.endLocked(h, rl.lostErr("renewal found the key gone or taken"))
		rl.mu.Unlock()
		return false, nil
	}
	rl.extendedLocked(h, sent)
	rl.mu.Unlock()
	return true, nil
}

// endAndRelease ends the hold with cause and then releases the lock, on the
// watchdog's own initiative (the maximum hold). In that order: Done closes
// and Until turns zero before the key can be taken by anyone else, so the
// holder never believes it holds a lock that another may hold.
func (rl *RedisLock) endAndRelease(h *hold, cause error) {
	rl.mu.Lock()
	rl.endLocked(h, cause)
	rl.mu.Unlock()
	rl.releaseQuietly(h.parent, h.id, h.lease)
}

// retryBackoff is the wait before renewal attempt n+1 after n failures in a
// row: interval/8, doubling, at most interval/2, and at least 1ms.
func retryBackoff(interval time.Duration, failures int) time.Duration {
	d := interval / 8
	for i := 1; i < failures && d < interval/2; i++ {
		d *= 2
	}
	return max(min(d, interval/2), time.Millisecond)
}
