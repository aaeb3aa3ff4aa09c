package redislock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrNotAcquired reports that AcquireWait or Do gave up: its context ended,
// or its wait timeout passed (the error then matches ctx.Err() or
// context.DeadlineExceeded too), or its RetryStrategy ran out.
var ErrNotAcquired = errors.New("redislock: not acquired")

// AcquireWait blocks until this RedisLock holds the lock, or ctx ends, or the
// wait timeout set with WithWaitTimeout passes. A re-entry returns after its
// round trip, also when this RedisLock takes the lock while the call waits
// (another goroutine's Acquire or AcquireWait on it). As with AcquireCtx, ctx is the holding context of a first
// acquisition: it bounds the renewal of the hold, not the lock. To bound the
// wait alone, use WithWaitTimeout.
//
// It makes a first attempt at once; only if the lock is busy does it
// subscribe to the release channel derived from the key and, once the
// server has confirmed the subscription, attempt again, so that no release
// can be missed and waiting on a free lock costs what an acquisition costs.
// Then it waits without polling: a release publishes a wake-up, and the
// waiter that has waited longest in this process (per pub/sub client)
// makes the next attempt; the others wait behind it, so waiters of one
// process acquire in arrival order and a release costs one attempt per
// waiting process. An attempt that loses learns the holder's remaining
// lease, and the next attempt comes no later than its end (a holder that
// crashed publishes nothing). Without wake-ups (no pub/sub client, or the
// subscription down), attempts are paced by the RetryStrategy.
//
// When it gives up it returns an error matching ErrNotAcquired and
// ctx.Err() (or context.DeadlineExceeded for the wait timeout), also when
// ctx had already ended. When this RedisLock's hold has ended (lost, say)
// and is not yet released, it returns that reason at once, as AcquireCtx
// does. A Redis error is returned as such.
func (rl *RedisLock) AcquireWait(ctx context.Context) error {
	if err := rl.check(ctx); err != nil {
		return err
	}
	if l := rl.locker; !l.shared { // Close joins the waits of its locks
		if l.isClosed() || !l.enter() {
			return opErr("wait for", rl.key, ErrLockerClosed)
		}
		defer l.wg.Done()
	}
	start := time.Now()
	err := rl.acquireWait(ctx)
	countWait(start, err)
	return err
}

// acquireWait is AcquireWait. Its round trips run within ctx: holding,
// also ended when a Locker that can close closes, so that Close waits for
// no call past the client's timeout for it; a hold it begins keeps holding.
func (rl *RedisLock) acquireWait(holding context.Context) error {
	if err := retryErr(rl.retry); err != nil {
		return err
	}
	ctx := holding
	if !rl.locker.shared {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(holding)
		defer cancel()
		defer context.AfterFunc(rl.locker.closing, cancel)()
	}
	waitCtx := ctx
	if rl.waitTimeout > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, rl.waitTimeout)
		defer cancel()
	}
	if rl.fair() {
		return rl.fairWait(ctx, holding, waitCtx)
	}
	var w *waiter // in the queue of this process's waiters on the key
	defer func() { w.quit() }()
	next := attemptTimer{clock: rl.clock}
	defer next.stop()
	arm := next.arm
	first := rl.attemptsFirst() // the first attempt is due, before any wait
	if !first {
		// Others of this process wait for the key already: queue behind
		// them rather than barge in at a release.
		w = rl.join(waitCtx, "")
	}

	failures, ticked := 0, false
	for {
		if err := rl.endedHoldErr(); err != nil {
			return err // lost (or the like) and not yet released: say so now
		}
		switch {
		case rl.lockerClosed():
			return opErr("wait for", rl.key, ErrLockerClosed)
		case ending(ctx):
			return rl.gaveUp(ctx)
		case ending(waitCtx) && !first:
			return rl.gaveUp(waitCtx)
		}
		head, n := w.read()
		if rl.Holds() > 0 {
			head, n.attempt = true, true // rl took the lock: re-enter it, whatever waits before us
		}
		switch {
		case head && (n.attempt || ticked):
			ticked = false
			first = false
			// The round trip is bounded by ctx, not by the wait timeout: an
			// attempt under way is never cut short into an ambiguous one.
			ok, pttl, err := rl.acquireCtx(ctx, holding)
			switch {
			case ok:
				w.acquired(rl.leaseOfHold())
				return nil
			case err != nil && ending(ctx):
				continue // gave up, unless the error is the hold's end
			case err != nil:
				return err
			}
			failures++
			d, err := rl.nextAttempt(failures, pttl, w)
			if err != nil {
				return err
			}
			if w == nil && rl.pubsub != nil {
				// Subscribe now, and attempt again as soon as the
				// subscription is confirmed: a release between the two
				// attempts cannot go unheard.
				w = rl.join(waitCtx, "")
				continue
			}
			arm(d)
		case head && n.sibling > 0:
			// A waiter of ours holds it now; its release will wake us.
			if w.subscribed() {
				arm(n.sibling)
			} else {
				d, _ := rl.retry.Backoff(max(failures, 1))
				arm(min(d, n.sibling))
			}
		}

		var tick <-chan time.Time
		if head {
			tick = next.c()
		}
		select {
		case <-waitCtx.Done():
		case <-w.wake():
		case <-rl.heldChange(): // a hold of rl (another goroutine's) ended or began
		case <-rl.lockerDone():
		case <-tick:
			ticked = true
		}
	}
}

// nextAttempt returns how long a wait waits after its attempt number
// failures found the lock held with wait left of its lease (negative:
// no expiry): until the lease ends when w hears releases, else also no
// longer than the RetryStrategy says. It returns ErrNotAcquired when the
// strategy gives up.
func (rl *RedisLock) nextAttempt(failures int, wait time.Duration, w *waiter) (time.Duration, error) {
	d, more := rl.retry.Backoff(failures)
	if !more {
		return 0, fmt.Errorf("%w: %q still held after %d attempts", ErrNotAcquired, rl.key, failures)
	}
	switch {
	case wait < 0: // no expiry: only releases and retries end it
	case w.subscribed():
		d = wait // a release wakes us; its lease bounds the wait
	default:
		d = min(d, wait)
	}
	return max(d, 0), nil
}

// attemptTimer is a wait's timer of its next attempt, made when first
// armed.
type attemptTimer struct {
	clock clock
	t     timer
}

func (a *attemptTimer) arm(d time.Duration) {
	if a.t == nil {
		a.t = a.clock.NewTimer(d)
	} else {
		a.t.Reset(d)
	}
}

func (a *attemptTimer) stop() {
	if a.t != nil {
		a.t.Stop()
	}
}

// c is the timer's channel; nil (never ready) before it is armed.
func (a *attemptTimer) c() <-chan time.Time {
	if a.t == nil {
		return nil
	}
	return a.t.C()
}

// gaveUp is the error of a wait that ctx cut short, or that the Locker's
// Close ended meanwhile.
func (rl *RedisLock) gaveUp(ctx context.Context) error {
	if rl.lockerClosed() {
		return opErr("wait for", rl.key, ErrLockerClosed)
	}
	return fmt.Errorf("%w: %q: %w", ErrNotAcquired, rl.key, cmpOr(ctx.Err(), context.DeadlineExceeded))
}

// ending reports whether ctx has ended, or its deadline has passed: a
// call can fail on the deadline (go-redis sets it on the connection) a
// moment before ctx's own timer ends it.
func ending(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// attemptsFirst reports whether AcquireWait makes an attempt before it
// joins the queue of this process's waiters: when it would re-enter, or
// find the reason its hold ended, or when nobody here waits for the key.
func (rl *RedisLock) attemptsFirst() bool {
	rl.mu.Lock()
	held := rl.cur != nil && rl.cur.count > 0
	rl.mu.Unlock()
	return held || !rl.othersWaiting()
}

// endedHoldErr returns why the current hold ended, while acquisitions it
// counted are not yet released.
func (rl *RedisLock) endedHoldErr() error {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if h := rl.cur; h != nil && h.count > 0 && !h.live() {
		return h.err
	}
	return nil
}

// heldChange returns a channel that is closed when the live hold of rl
// ends, or when there is none, when the next one begins: a wait of rl
// then re-enters it at once, whatever woke it and wherever it waits.
func (rl *RedisLock) heldChange() <-chan struct{} {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if h := rl.liveHold(); h != nil {
		return h.done
	}
	if rl.began == nil {
		rl.began = make(chan struct{})
	}
	return rl.began
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

// lockerDone returns the channel closed by Close of rl's Locker.
func (rl *RedisLock) lockerDone() <-chan struct{} {
	return rl.locker.closing.Done()
}
