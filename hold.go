package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redislock/redislock/internal/renew"
	"github.com/redislock/redislock/internal/store"
)

// errReleased is the cause of a hold's life context after its release.
var errReleased = errors.New("redislock: released")

// beginHold makes the hold of id, with a lease of lease that lasts until
// until by our accounting, and token, the lock's current hold, with one
// acquisition, and hands it to its scheduler (its renewals, lease deadline
// and maximum hold) and to its holding context. It begins nothing, and
// says why, when until has passed (the reply came too late) or the lock's
// Locker is closed.
func (rl *RedisLock) beginHold(holding context.Context, id string, lease time.Duration, token int64, until time.Time) error {
	if !rl.locker.clock.Now().Before(until) {
		return fmt.Errorf("%w: %w before the reply came", ErrLockLost, errLeaseRanOut)
	}
	l := rl.locker
	h := &hold{id: id, token: token, lease: lease, parent: holding, done: make(chan struct{}), rl: rl,
		state: renewing, count: 1}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if h.renewal = l.renewals.Add(h, holding, rl.waited(rl.renewal(), lease), rl.names.renew, id, lease, until, rl.opts.maxHold, rl.opts.watchdog); h.renewal == nil {
		return ErrLockerClosed
	}
	rl.cur = h
	if rl.began != nil {
		close(rl.began)
		rl.began = nil
	}
	metricHeld.Inc(rl.series().held...)
	if holding.Done() != nil {
		h.unbind = context.AfterFunc(holding, func() { rl.holdingContextEnded(h) })
	}
	return nil
}

// holdingContextEnded stops the renewal of h: the hold lasts out its lease.
func (rl *RedisLock) holdingContextEnded(h *hold) {
	rl.mu.Lock()
	if h.state != renewing {
		rl.mu.Unlock()
		return
	}
	h.state = expiring
	rl.locker.renewals.Stop(h.renewal) // its lease deadline and maximum hold only
	rl.logHold(slog.LevelDebug, "redislock: holding context ended; renewal stopped, the lease runs out", h, causeAttr(context.Cause(h.parent)))
	rl.mu.Unlock()
}

// endLocked ends h once, with cause, and returns the cause it ended with.
// The caller holds rl.mu.
func (rl *RedisLock) endLocked(h *hold, cause error) error {
	if !h.live() {
		return h.err
	}
	rl.closeLocked(h, cause)
	rl.countEnd(h, cause)
	asked := !rl.opts.watchdog && errors.Is(cause, errLeaseRanOut) // WithoutWatchdog: the lease ran out, as it was to
	switch {
	case !asked && errors.Is(cause, ErrLockLost):
		// Renewals failed because the application closed its client:
		// the end of its shutdown, not a loss to warn of.
		rl.logHold(rl.locker.closedLevel(cause, slog.LevelWarn), "redislock: hold lost", h, causeAttr(cause))
	case !asked && errors.Is(cause, ErrMaxHoldExceeded):
		rl.logHold(slog.LevelWarn, "redislock: hold ended at its maximum", h, causeAttr(cause))
	case cause != nil: // the holding context ended, then the lease ran out; or Close; or no watchdog
		rl.logHold(slog.LevelDebug, "redislock: hold ended", h, causeAttr(cause))
	}
	return cause
}

// closeLocked moves h to ended with cause and stops everything that would
// run for it; the caller counts the end. The caller holds rl.mu.
func (rl *RedisLock) closeLocked(h *hold, cause error) {
	h.state, h.err = ended, cause
	if h.unbind != nil {
		h.unbind()
	}
	rl.locker.renewals.Remove(h.renewal)
	if h.endLife != nil {
		h.endLife(cmp.Or(cause, errReleased))
	}
	close(h.done)
}

// leaseRanOutLocked ends h, whose lease ran out by our own accounting,
// while renewals failed with lastErr (nil if none did). The caller holds
// rl.mu.
func (rl *RedisLock) leaseRanOutLocked(h *hold, lastErr error) {
	var err error
	switch {
	case h.state == expiring: // as asked: the holding context stopped renewal
		err = fmt.Errorf("redislock: %q: the lease ran out after the holding context ended: %w", rl.key, context.Cause(h.parent))
	case lastErr != nil:
		err = fmt.Errorf("%w: %q: %w while renewals failed: %w", ErrLockLost, rl.key, errLeaseRanOut, lastErr)
	case rl.opts.watchdog:
		err = fmt.Errorf("%w: %q: %w before a renewal got through", ErrLockLost, rl.key, errLeaseRanOut)
	default:
		err = fmt.Errorf("%w: %q: %w: %v (no watchdog)", ErrLockLost, rl.key, errLeaseRanOut, h.lease)
	}
	rl.endLocked(h, err)
}

// maxHoldReachedLocked ends h at its maximum hold and then releases the
// lock, in that order: Done closes and Until turns zero before the key can
// be taken by anyone else, so the holder never believes it holds a lock
// that another may hold. A Release of that hold returns once this release
// is over (within its context). The caller holds rl.mu.
func (rl *RedisLock) maxHoldReachedLocked(h *hold) {
	releasing := make(chan struct{})
	h.selfRelease = releasing
	rl.endLocked(h, fmt.Errorf("%w: %q held for %v", ErrMaxHoldExceeded, rl.key, rl.opts.maxHold))
	rl.locker.spawn(func() { // a round trip of its own, never on the scheduler's path
		defer close(releasing)
		rl.letGo(h.parent, h.id, h.lease, 0, true)
	})
}

// renewalFailed logs a failed renewal of h, to be made again: the first
// of a run at Warn, the others at Debug.
func renewalFailed(h *hold, r renew.Retry) {
	level := slog.LevelDebug
	if r.Attempt == 1 {
		level = h.rl.locker.closedLevel(r.Err, slog.LevelWarn)
	}
	h.rl.logHold(level, "redislock: renewal failed; retrying", h, slog.Int("attempt", r.Attempt), slog.Duration("retry_in", r.In), causeAttr(r.Err))
}

// leaseEnded ends h as its Locker's scheduler reports: its maximum hold
// came, its lease ran out (err: the latest renewal's failure), its key was
// found gone; or a renewal extended its key after the hold ended, which is
// then given back, unless a release deleted it.
func leaseEnded(h *hold, end renew.End, err error) {
	rl := h.rl
	rl.mu.Lock()
	if end == renew.Late {
		released := !h.live() && h.err == nil && !h.keyLeft
		rl.mu.Unlock()
		if !released { // round trips of their own, never on the scheduler's path
			rl.letGo(h.parent, h.id, h.lease, 0, false)
		}
		return
	}
	defer rl.mu.Unlock()
	switch {
	case !h.live():
	case end == renew.MaxHold:
		rl.maxHoldReachedLocked(h)
	case end == renew.RanOut:
		rl.leaseRanOutLocked(h, err)
		if err != nil && store.Ambiguous(err) {
			// A renewal whose reply was lost, or that the replicas did not
			// acknowledge, may have extended the key on its primary:
			// nobody uses it now.
			rl.letGo(h.parent, h.id, h.lease, 0, false)
		}
	default:
		rl.endLocked(h, rl.lostErr("renewal found the key gone or taken"))
	}
}

// lifeOf returns a context that ends with h, its cause being why h ended
// (errReleased after a release).
func (rl *RedisLock) lifeOf(h *hold) context.Context {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if h.life == nil {
		h.life, h.endLife = context.WithCancelCause(context.Background())
		if !h.live() {
			h.endLife(cmp.Or(h.err, errReleased))
		}
	}
	return h.life
}

func (rl *RedisLock) lostErr(why string) error {
	return fmt.Errorf("%w: %q: %s", ErrLockLost, rl.key, why)
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// leftToExpire records that h's key was left to expire with its lease: a
// renewal that was in the network then, and gets through, is undone.
func (rl *RedisLock) leftToExpire(h *hold) {
	rl.mu.Lock()
	h.keyLeft = true
	rl.mu.Unlock()
}

// giveBack counts one acquisition of the hold of (the current one, if nil)
// released. It returns the reason of a hold that had ended already, and
// last with the hold when this was the final acquisition of a live hold,
// which it ends (the caller counts the end).
func (rl *RedisLock) giveBack(of *hold) (h *hold, last bool, endErr error) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	h = rl.cur
	switch {
	case h == nil || h.count == 0 || of != nil && h != of:
		return nil, false, nil
	case !h.live():
		h.count--
		return h, false, h.err
	case h.count > 1:
		h.count--
		return h, false, nil
	}
	h.count = 0
	rl.closeLocked(h, nil)
	return h, true, nil
}

// liveHold returns the current hold if it is live and counts acquisitions.
// The caller holds rl.mu.
func (rl *RedisLock) liveHold() *hold {
	if h := rl.cur; h != nil && h.count > 0 && h.live() {
		return h
	}
	return nil
}

// Token returns the fencing token of the live hold (see WithFencing): 0 when
// nothing is held or the lock is not fenced.
func (rl *RedisLock) Token() int64 { return rl.snapshot().token }

// snapshot returns what the accessors report of the live hold: all zero
// when there is none.
func (rl *RedisLock) snapshot() (s struct {
	id    string
	token int64
	until time.Time
	count int
}) {
	if rl == nil {
		return s
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if h := rl.liveHold(); h != nil {
		s.id, s.token, s.until, s.count = h.id, h.token, rl.locker.renewals.Until(h.renewal), h.count
	}
	return s
}

// Owner returns the owner id of the live hold: the value of the key while
// it is held, as Inspect and "redislock status" show it. It is "" when
// nothing is held. Each hold has a fresh random id.
func (rl *RedisLock) Owner() string { return rl.snapshot().id }

// Until returns the end of the live hold's lease by the holder's own
// conservative accounting: the time the latest successful acquisition,
// re-entry or renewal was sent, plus the lease, less a margin of 1% + 2ms.
// Redis may keep the key a little longer, never shorter, as long as clocks
// run at the same rate. It is the zero time when nothing is held.
func (rl *RedisLock) Until() time.Time { return rl.snapshot().until }

// Holds returns how many acquisitions the live hold counts: 0 when nothing
// is held, including after the hold ended.
func (rl *RedisLock) Holds() int { return rl.snapshot().count }

// Done returns a channel that is closed when the current hold ends: its last
// release, its loss, its maximum hold, or the end of its lease after its
// holding context ended. It is already closed when nothing is held. A new
// hold has a new channel.
func (rl *RedisLock) Done() <-chan struct{} {
	if rl == nil {
		return closedChan
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil {
		return closedChan
	}
	return rl.cur.done
}

// Err returns nil while the lock is held, when nothing was held, and after a
// release (also one whose round trip failed: the key then expires with its
// lease, and ReleaseCtx returned the error). Otherwise it returns why the latest hold ended: an error
// matching ErrLockLost (also when the final release found the key gone or
// taken) or ErrMaxHoldExceeded, or the holding context's cause when the
// lease ran out after that context ended.
func (rl *RedisLock) Err() error {
	if rl == nil {
		return nil
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil {
		return nil
	}
	return rl.cur.err
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
