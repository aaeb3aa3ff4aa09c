package redislock

import (
	"context"
	"fmt"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

// firstDuty returns when the watchdog of h has its first work: the first
// renewal, or the maximum hold; zero when it has none (no watchdog, no
// maximum hold), and then only the end of the holding context starts it.
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

// startWatch runs the watchdog of h in the calling goroutine (a timer's or
// context.AfterFunc's), unless it runs already or h is stopping or over.
// A hold released before its first duty never starts a goroutine.
func (rl *RedisLock) startWatch(h *hold) {
	rl.mu.Lock()
	if h.stopped != nil || h.stopping || h.ended { // running, or not to run
		rl.mu.Unlock()
		return
	}
	h.ctx, h.cancel = context.WithCancel(h.parent)
	h.stopped = make(chan struct{})
	rl.mu.Unlock()
	rl.watch(h)
}

// watch looks after one hold until it ends: it renews the lease every
// lease/3 (unless WithoutWatchdog), ends the hold at the maximum hold, and
// releases the lock when the holding context ends. It owns h.stopped;
// stopping it is h.cancel and then a wait on h.stopped, so nothing it does
// outlives that wait.
//
// Loss by a lease that ran out is not its job: h.timer ends the hold at the
// deadline even while a renewal is stuck in the network, because go-redis
// does not cut a read short when a context ends.
func (rl *RedisLock) watch(h *hold) {
	defer close(h.stopped)

	interval := h.lease / 3
	nextRenew := h.started.Add(interval)
	maxAt := h.started.Add(rl.maxHold)
	failures := 0
	var t timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()

	for {
		if h.ctx.Err() != nil {
			rl.stopWatching(h)
			return
		}
		now := rl.clock.Now()
		if rl.maxHold > 0 && !now.Before(maxAt) {
			rl.finish(h, fmt.Errorf("%w: %q held for %v", ErrMaxHoldExceeded, rl.key, rl.maxHold))
			return
		}
		if rl.watchdog && !now.Before(nextRenew) {
			ok, err := rl.renew(h, now)
			switch {
			case err == nil && ok:
				failures = 0
				nextRenew = now.Add(interval)
			case err == nil: // definite loss, or the hold ended meanwhile
				return
			case h.ctx.Err() != nil: // stopped, or the holding context ended
			default:
				failures++
				backoff := retryBackoff(interval, failures)
				nextRenew = now.Add(backoff)
				logx.Errorf("redislock: renewing %q (owner %s) failed, attempt %d, retrying in %v: %v",
					rl.key, h.id, failures, backoff, err)
			}
			continue
		}

		// Nothing due: sleep until the next duty or the end of the context.
		var wake time.Time
		if rl.watchdog {
			wake = nextRenew
		}
		if rl.maxHold > 0 && (wake.IsZero() || maxAt.Before(wake)) {
			wake = maxAt
		}
		var tick <-chan time.Time
		if !wake.IsZero() {
			if d := wake.Sub(now); t == nil {
				t = rl.clock.NewTimer(d)
			} else {
				t.Reset(d)
			}
			tick = t.C()
		}
		select {
		case <-h.ctx.Done():
		case <-tick:
		}
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
// watchdog.
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
