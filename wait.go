package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrNotAcquired reports that AcquireWait gave up: its context ended (the
// error then matches ctx.Err() too), or its RetryStrategy ran out.
var ErrNotAcquired = errors.New("redislock: not acquired")

// AcquireWait blocks until this RedisLock holds the lock, or ctx ends. A
// re-entry returns after its round trip. As with AcquireCtx, ctx binds the
// hold that a first acquisition makes.
//
// It waits without polling: a release publishes a wake-up on a channel
// derived from the key, and the waiter that has waited longest in this
// process (per pub/sub client) makes the next attempt; the others wait for
// their turn, so waiters of one process acquire in arrival order and a
// release costs one attempt per waiting process. An attempt that loses
// learns the holder's remaining lease, and the next attempt comes no later
// than its end (a holder that crashed publishes nothing). Without wake-ups
// (no pub/sub client, or the subscription down), attempts are paced by the
// RetryStrategy.
//
// When ctx ends it returns an error matching both ErrNotAcquired and
// ctx.Err(); a Redis error is returned as such.
func (rl *RedisLock) AcquireWait(ctx context.Context) error {
	if err := rl.check(ctx); err != nil {
		return err
	}
	start := time.Now()
	err := rl.acquireWait(ctx)
	countWait(start, err)
	return err
}

func (rl *RedisLock) acquireWait(ctx context.Context) error {
	if err := retryErr(rl.retry); err != nil {
		return err
	}
	if rl.Holds() > 0 { // a re-entry needs no waiting
		_, _, err := rl.acquireCtx(ctx)
		return err
	}

	w := rl.joinWait(ctx)
	defer w.quit()
	var t timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	arm := func(d time.Duration) {
		if t == nil {
			t = rl.clock.NewTimer(d)
		} else {
			t.Reset(d)
		}
	}

	failures := 0
	for {
		head, turn, promoted := w.next()
		switch {
		case head && turn:
			ok, pttl, err := rl.acquireCtx(ctx)
			switch {
			case ctx.Err() != nil && !ok:
				return errors.Join(ErrNotAcquired, ctx.Err())
			case err != nil:
				return err
			case ok:
				w.acquired(rl.leaseOfHold())
				return nil
			}
			failures++
			d, more := rl.retry.Backoff(failures)
			if !more {
				return fmt.Errorf("%w: %q still held after %d attempts", ErrNotAcquired, rl.key, failures)
			}
			switch {
			case pttl < 0: // no expiry: only releases and retries end it
			case w.subscribed():
				d = pttl // the release wakes us; its lease bounds the wait
			default:
				d = min(d, pttl)
			}
			arm(max(d, 0))
		case head && promoted > 0:
			// A waiter of ours holds it now; its release will wake us.
			if w.subscribed() {
				arm(promoted)
			} else {
				d, _ := rl.retry.Backoff(max(failures, 1))
				arm(min(d, promoted))
			}
		}

		var tick <-chan time.Time
		if t != nil && head {
			tick = t.C()
		}
		select {
		case <-ctx.Done():
			return errors.Join(ErrNotAcquired, ctx.Err())
		case <-w.wake():
		case <-tick:
			w.take()
		}
	}
}

// take gives w a turn of its own: its timer fired.
func (w *waiter) take() {
	if w == nil {
		return
	}
	w.hub.mu.Lock()
	w.turn = true
	w.hub.mu.Unlock()
}

// leaseOfHold returns the lease of the current hold.
func (rl *RedisLock) leaseOfHold() time.Duration {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil {
		return 0
	}
	return rl.cur.lease
}
