package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

// firstDuty returns when the watchdog of h has its first work: the first
// renewal, or the maximum hold; zero when it has none (no watchdog, no
// maximum hold), and then only the end of the holding context runs it.
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
// timer's or context.AfterFunc's), does the duties that are due, arms
// h.wake for the next ones, and returns. A held lock costs no goroutine
// between duties. Runs never overlap, and none starts once Release has
// stopped the watchdog or the hold is over; stopping is h.cancel, then a
// wait on h.stepDone when a run is under way, so nothing the watchdog does
// outlives that wait.
//
// Loss by a lease that ran out is not its job: h.timer ends the hold at the
// deadline even while a renewal is stuck in the network, because go-redis
// does not cut a read short when a context ends.
func (rl *RedisLock) watch(h *hold) {
	rl.mu.Lock()
	if h.running || h.stopping || h.ended { // running, or not to run
		rl.mu.Unlock()
		return
	}
	if h.cancel == nil { // the first run
		h.ctx, h.cancel = context.WithCancel(h.parent)
		h.nextRenew = h.started.Add(h.lease / 3)
	}
	h.running = true
	h.stepDone = make(chan struct{})
	rl.mu.Unlock()

	for {
		next, over := rl.duties(h)
		rl.mu.Lock()
		if !over && h.parent.Err() != nil && !h.stopping && !h.ended {
			// The holding context ended during this run, and the
			// context.AfterFunc that reports it found us running.
			rl.mu.Unlock()
			continue
		}
		h.running = false
		close(h.stepDone)
		if !over && !next.IsZero() && !h.stopping && !h.ended {
			d := next.Sub(rl.clock.Now())
			if h.wake == nil {
				h.wake = rl.clock.WatchFunc(d, func() { rl.watch(h) })
			} else {
				h.wake.Reset(d)
			}
		}
		rl.mu.Unlock()
		return
	}
}

// duties renews the lease of h when a renewal is due (unless
// WithoutWatchdog), ends the hold at the maximum hold, and releases the lock
// when the holding context has ended. It returns when the next duty is due,
// or over when the watchdog of h has no more to do. A call before anything
// is due does nothing, so a spurious wake-up costs no round trip.
func (rl *RedisLock) duties(h *hold) (next time.Time, over bool) {
	interval := h.lease / 3
	maxAt := h.started.Add(rl.maxHold)
	for {
		if h.ctx.Err() != nil || h.parent.Err() != nil {
			rl.stopWatching(h)
			return time.Time{}, true
		}
		now := rl.clock.Now()
		if rl.maxHold > 0 && !now.Before(maxAt) {
			rl.finish(h, fmt.Errorf("%w: %q held for %v", ErrMaxHoldExceeded, rl.key, rl.maxHold))
			return time.Time{}, true
		}
		if rl.watchdog && !now.Before(h.nextRenew) {
			ok, err := rl.renew(h, now)
			switch {
			case err == nil && ok:
				h.failures = 0
				h.nextRenew = now.Add(interval)
			case err == nil: // definite loss, or the hold ended meanwhile
				return time.Time{}, true
			case h.ctx.Err() != nil: // stopped, or the holding context ended
			default:
				h.failures++
				backoff := retryBackoff(interval, h.failures)
				h.nextRenew = now.Add(backoff)
				logx.Errorf("redislock: renewing %q (owner %s) failed, attempt %d, retrying in %v: %v",
					rl.key, h.id, h.failures, backoff, err)
			}
			continue
		}

		if rl.watchdog {
			next = h.nextRenew
		}
		if rl.maxHold > 0 && (next.IsZero() || maxAt.Before(next)) {
			next = maxAt
		}
		return next, false
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
	ctx, cancel := context.WithTimeout(h.ctx, max(timeout, time.Millisecond))
	ok, err := rl.extend(ctx, h.id, h.leaseMs)
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
	case h.ended && ok:
		// Declared lost while this renewal was in the network, yet it got
		// through: the key carries our id again, and nobody will use it.
		rl.mu.Unlock()
		rl.releaseQuietly(h.parent, h.id)
		return false, nil
	case h.ended:
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

// stopWatching runs when h.ctx has ended: by Release, by the end of the hold,
// or by the end of the holding context, which releases the lock.
func (rl *RedisLock) stopWatching(h *hold) {
	rl.mu.Lock()
	byUs := h.ended || h.stopping
	rl.mu.Unlock()
	if !byUs {
		rl.finish(h, context.Cause(h.parent))
	}
}

// finish ends the hold with cause and then releases the lock, on the
// watchdog's own initiative. In that order: Done closes and Until turns
// zero before the key can be taken by anyone else, so the holder never
// believes it holds a lock that another may hold. A Release called after
// Done returns once this release is over, because it waits for the
// watchdog's run.
func (rl *RedisLock) finish(h *hold, cause error) {
	rl.mu.Lock()
	rl.endLocked(h, cause)
	rl.mu.Unlock()
	rl.releaseQuietly(h.parent, h.id)
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
