package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
	"github.com/redislock/redislock/internal/wake"
)

// AcquireWait blocks until this RedisLock holds the lock (a first
// acquisition, or a re-entry), ctx ends, or the wait timeout of
// WithWaitTimeout passes. As with AcquireCtx, ctx is the holding context of
// a first acquisition. It attempts at once, then waits without polling: a
// release wakes it (through pub/sub, see WithPubSub), and without wake-ups
// its RetryStrategy paces it, never later than the holder's lease; see
// docs/waiting.md. Giving up returns an error matching ErrNotAcquired and
// ctx.Err() (context.DeadlineExceeded for the wait timeout); a hold of
// this RedisLock that ended and is not released returns its reason at
// once; a Redis error (ErrRefused, say) is returned as it is; and, as for
// AcquireCtx, a lock taken or handed over after its lease ran out by our
// own accounting (a server paused past the lease) returns ErrLockLost.
func (rl *RedisLock) AcquireWait(ctx context.Context) error {
	if err := rl.check(ctx); err != nil {
		return err
	}
	return rl.acquireWait(ctx, ctx)
}

// acquireWait is AcquireWait, its round trips within ctx, also ended when
// a Locker that can close closes, so that Close waits for no call past the
// client's timeout for it; a hold it begins has holding as its holding
// context.
//
// One loop waits for plain and fair locks alike. Only the head of this
// process's queue of the key attempts (a fair waiter always may: its queue
// is in Redis), when told to (a release, a handoff to it, the head before
// it leaving) or when its timer says: the holder's lease is over, the
// RetryStrategy's pace without wake-ups, or a fair waiter's refresh.
func (rl *RedisLock) acquireWait(ctx, holding context.Context) (err error) {
	if l := rl.locker; !l.life.shared { // Close joins the waits of its locks
		if l.isClosed() || !l.enter() {
			return opErr("wait for", rl.key, ErrLockerClosed)
		}
		defer l.life.wg.Done()
	}
	ctx, span := rl.startWait(ctx)
	start := time.Now()
	defer func() { rl.countWait(start, err); span.end(start, err) }()
	if err := retryErr(rl.opts.retry); err != nil {
		return err
	}
	if !rl.locker.life.shared {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(rl.locker.life.closing, cancel)()
	}
	waitCtx := ctx
	if rl.opts.waitTimeout > 0 {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithTimeout(ctx, rl.opts.waitTimeout)
		defer cancel()
	}
	var fw *fairWaiter // a fair wait's place in the key's queue in Redis, once it has one
	if rl.fair() {
		var turn bool
		var err error
		fw, turn, err = rl.beginFairWait(waitCtx)
		defer func() { rl.endFairWait(ctx, fw, turn) }()
		if err != nil {
			return err
		}
	}
	var w *wake.Waiter // in this process's queue of waiters on the key
	defer func() { w.Leave(0) }()
	join := func() error { // a fair wait queues in Redis from its next attempt on
		id := ""
		if rl.fair() {
			if fw == nil {
				fw = &fairWaiter{id: newID(), lease: time.Duration(rl.expiry.Load())}
				if err := validExpiry(fw.lease); err != nil {
					fw = nil
					return err
				}
			}
			id = fw.id
		}
		w = rl.locker.wake.Join(waitCtx, rl, rl.opts.pubsub, rl.names.channel, id) // subscribed before it queues: no release or handoff goes unheard
		return nil
	}
	var next clock.Timer // of the next attempt; made when first armed
	var due time.Time    // when the next attempt that counts is due
	refresh := false     // the timer only keeps fw live in its queue: its attempt does not count
	defer func() {
		if next != nil {
			next.Stop()
		}
	}()
	arm := func(d time.Duration) { // the next counted attempt in d; a fair waiter's refresh before
		due = rl.locker.clock.Now().Add(d)
		if refresh = fw != nil && d > fw.lease/3; refresh {
			d = fw.lease / 3
		}
		if next == nil {
			next = rl.locker.clock.NewTimer(d)
		} else {
			next.Reset(d)
		}
		if fw != nil {
			w.AttemptsAt(rl.locker.clock.Now().Add(d))
		}
	}
	if !rl.attemptsFirst(fw) {
		// Others of this process wait for the key already: queue behind
		// them rather than barge in at a release.
		if err := join(); err != nil {
			return err
		}
	}

	failures, ticked := 0, false
	var lag error // the last attempt's, when its replicas did not acknowledge it
	for {
		if err := rl.endedHoldErr(); err != nil {
			return err // lost (or the like) and not yet released: say so now
		}
		switch {
		case rl.lockerClosed():
			return opErr("wait for", rl.key, ErrLockerClosed)
		case ending(ctx):
			return rl.gaveUp(ctx, lag)
		case ending(waitCtx) && failures > 0:
			return rl.gaveUp(waitCtx, lag)
		}
		head, n := w.Read()
		if rl.Holds() > 0 || failures == 0 && ending(waitCtx) {
			// rl took the lock: re-enter it, whatever waits before us; or
			// the wait timeout passed before the attempt a wait always makes.
			head, n.Attempt = true, true
		}
		switch {
		case head && (n.Attempt || n.Handoff != nil || ticked):
			counts := !ticked || !refresh
			ticked = false
			// The round trip is bounded by ctx, not by the wait timeout: an
			// attempt under way is never cut short into an ambiguous one.
			span.attempted()
			done, wait, err := rl.attempt(ctx, holding, fw, n.Handoff)
			lag = nil
			if lagging(err) {
				lag = err
			}
			switch {
			case done && err == nil && ending(ctx): // taken as the wait gave up
				_ = rl.releaseDetached(ctx, nil)
				return rl.gaveUp(ctx, nil)
			case done && err == nil:
				if rl.opts.permits > 0 || rl.opts.shared {
					w.Leave(0) // the next may take another permit, or share
				} else {
					w.Leave(rl.leaseOfHold())
				}
				return nil
			case done:
				return err
			case err != nil && ending(ctx):
				continue // gave up, unless the error is the hold's end
			case lag != nil:
				// Given back, or kept by a fair wait: again once the
				// replicas may have caught up.
				wait = max(wait, replicasTimeout(time.Duration(rl.expiry.Load())))
			case err != nil:
				return err
			}
			if counts = counts || failures == 0; counts {
				failures++
			}
			d, err := rl.nextAttempt(failures, wait, w, lag)
			if err != nil {
				return err
			}
			if left := due.Sub(rl.locker.clock.Now()); !counts && left < d {
				// A refresh keeps the counted attempt where it was: a
				// holder that renews must not put it off for ever.
				d = max(left, 0)
			}
			if w == nil || rl.fair() && fw == nil {
				// Queue (and subscribe) now, and attempt again as soon as
				// the subscription is confirmed: a release between the two
				// attempts cannot go unheard. A fair wait queues in Redis
				// from this attempt on.
				if err := join(); err != nil {
					return err
				}
				if fw != nil || w.Subscribed() {
					continue
				}
			}
			arm(d)
		case head && n.Holder > 0:
			// Another waiter holds it now: its release will wake us, and
			// its key, unreleased, lives no longer than its lease.
			d, _ := rl.nextAttempt(max(failures, 1), n.Holder, w, nil)
			arm(d)
		}

		var tick <-chan time.Time
		if head && next != nil {
			tick = next.C()
		}
		select {
		case <-waitCtx.Done():
		case <-w.C():
			span.woken()
		case <-rl.heldChange(): // a hold of rl (another goroutine's) ended or began
		case <-rl.lockerDone():
		case <-tick:
			ticked = true
		}
	}
}

// attempt makes one attempt of a wait: a first acquisition, or a re-entry
// as AcquireCtx; for a fair wait with a place fw in the queue, one that keeps
// it there, or the takeover of m, a handoff to fw. It reports done when the
// wait is over, err saying how; otherwise how long the holder's lease has
// left, and any error.
func (rl *RedisLock) attempt(ctx, holding context.Context, fw *fairWaiter, m *store.Handoff) (done bool, wait time.Duration, err error) {
	if fw == nil {
		ok, pttl, err := rl.acquireCtx(ctx, holding, true)
		return ok, pttl, err
	}
	return rl.fairStep(ctx, holding, fw, m)
}

// nextAttempt returns how long a wait waits after its attempt number
// failures found the lock held with wait left of its lease (negative:
// no expiry), or failed with lag, which the replicas did not acknowledge:
// until the lease ends when w hears releases, else also no longer than
// the RetryStrategy says. It returns ErrNotAcquired when the strategy
// gives up.
func (rl *RedisLock) nextAttempt(failures int, wait time.Duration, w *wake.Waiter, lag error) (time.Duration, error) {
	d, more := rl.opts.retry.Backoff(failures)
	switch {
	case !more && lag != nil:
		return 0, fmt.Errorf("%w: %q at attempt %d, the RetryStrategy's last: %w", ErrNotAcquired, rl.key, failures, lag)
	case !more:
		return 0, fmt.Errorf("%w: %q still held at attempt %d, the RetryStrategy's last", ErrNotAcquired, rl.key, failures)
	}
	switch {
	case wait < 0: // no expiry: only releases and retries end it
	case w.Subscribed():
		// A release wakes us; the lease bounds the wait. A PTTL is whole
		// milliseconds, rounded down: the key is gone a millisecond after
		// it, not at it (PTTL 0 is a key still there).
		d = wait + time.Millisecond
	default:
		d = min(d, wait+time.Millisecond)
	}
	return max(d, 0), nil
}

// gaveUp is the error of a wait that ctx cut short, or that the Locker's
// Close ended meanwhile; lag, when not nil, the error of its last attempt,
// which its replicas did not acknowledge.
func (rl *RedisLock) gaveUp(ctx context.Context, lag error) error {
	if rl.lockerClosed() {
		return opErr("wait for", rl.key, ErrLockerClosed)
	}
	err := fmt.Errorf("%w: %q: %w", ErrNotAcquired, rl.key, cmp.Or(ctx.Err(), context.DeadlineExceeded))
	if lag != nil {
		err = fmt.Errorf("%w; the last attempt: %w", err, lag)
	}
	return err
}

// lagging reports the error of an attempt that ran but that the replicas
// of WithReplicas did not acknowledge in time.
func lagging(err error) bool {
	return errors.Is(err, ErrNotReplicated) && store.Ambiguous(err)
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

// attemptsFirst reports whether a wait makes an attempt before it joins
// this process's queue of the key: when it would re-enter, or find the
// reason its hold ended; else when nobody here waits for the key and the
// wait has no place fw in the queue in Redis already. A fair wait joins at
// once when the key's subscription is confirmed, or when it has no pub/sub
// to subscribe to: its attempt joins the queue in Redis, and takes the lock
// if it is free and nobody is ahead.
func (rl *RedisLock) attemptsFirst(fw *fairWaiter) bool {
	rl.mu.Lock()
	held := rl.cur != nil && rl.cur.count > 0
	rl.mu.Unlock()
	queued, subscribed := rl.locker.wake.Waiting(rl, rl.opts.pubsub, rl.names.channel)
	if rl.fair() {
		queued = subscribed || fw != nil || rl.opts.pubsub == nil
	}
	return held || !queued
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
	return rl.locker.life.closing.Done()
}

// beginFairWait counts a fair wait of rl and waits, within waitCtx, for its
// turn: one fair wait per RedisLock at a time, so that one that comes
// meanwhile re-enters the lock the first takes, or waits on in its place.
// It returns the place in the queue that a call which gave up left to it,
// if any, and whether it has the turn; endFairWait ends it either way.
func (rl *RedisLock) beginFairWait(waitCtx context.Context) (fw *fairWaiter, turn bool, err error) {
	rl.mu.Lock()
	rl.line.waits++
	rl.mu.Unlock()
	select {
	case rl.line.turn <- struct{}{}: // a free turn is taken, whatever the wait timeout
	default:
		select {
		case rl.line.turn <- struct{}{}:
		case <-waitCtx.Done():
			return nil, false, rl.gaveUp(waitCtx, nil)
		case <-rl.lockerDone():
			return nil, false, opErr("wait for", rl.key, ErrLockerClosed)
		}
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	fw, rl.line.parked = rl.line.parked, nil
	return fw, true, nil
}

// endFairWait ends a fair wait that had the place fw in the queue (nil if
// none). A place it did not take the lock with is the RedisLock's: it is
// left to the next call's turn; the last call out takes it out of the
// queue, passing on a lock handed to it, before its wait returns.
func (rl *RedisLock) endFairWait(ctx context.Context, fw *fairWaiter, turn bool) {
	rl.mu.Lock()
	rl.line.waits--
	if fw != nil && !fw.taken {
		rl.line.parked = fw
	}
	var last *fairWaiter
	if rl.line.waits == 0 {
		last, rl.line.parked = rl.line.parked, nil
	}
	rl.mu.Unlock()
	if turn {
		<-rl.line.turn
	}
	if last != nil {
		rl.letGo(ctx, last.id, last.lease, max(last.lease, abandonedFor), true)
	}
}
