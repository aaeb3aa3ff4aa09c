package redislock

import (
	"context"
	"time"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/renew"
	"github.com/redislock/redislock/internal/store"
)

// Fair locks: the waiters of a key queue in Redis, in a sorted set in the
// key's hash slot ordered by a server-side sequence, and a release hands
// the lock to the first live waiter (fair_release.lua): it sets the key to
// that waiter's id and publishes it, and the waiter holds the lock from the
// moment it hears, without a round trip of its own. A waiter is live until
// the time its entry in the waiters' hash names, by the server's clock: its
// wait renews it with an attempt at least every lease/3, and it lapses one
// lease after its process died. A waiter that gives up leaves the queue
// (unless another call of its RedisLock waits on in its place), and passes
// the lock on if it was handed to it meanwhile.

// WithFairness makes waits for the lock fair across processes: AcquireWait
// and Do queue in Redis, and each release hands the lock to the waiter that
// has waited longest, wherever it runs. See "Fair locks" in the package
// documentation for how, and for the limits.
func WithFairness() Option {
	return func(o *options) { o.fair = true }
}

// fairMode is the mode of a fair lock, which is taken only when no live
// waiter is queued, and handed over by its release.
var fairMode = &mode{take: (*RedisLock).attemptNow, release: store.FairRelease}

// fair reports whether rl is a fair lock.
func (rl *RedisLock) fair() bool { return rl.line != nil }

// fairKeys returns the keys of fair_acquire.lua.
func (rl *RedisLock) fairKeys() []string {
	keys := []string{rl.key, rl.names.acquire[1], rl.names.queue, rl.names.waiters, rl.names.holders}
	if rl.fenced() {
		keys = append(keys, rl.names.acquire[3])
	}
	return keys
}

// attemptFair runs fair_acquire.lua for id, joining the queue when window
// is positive. It returns the fencing token (0 when not fenced) of a lock
// taken; else -1, how long to wait before the next attempt, and the
// waiter's score in the queue.
func (rl *RedisLock) attemptFair(ctx context.Context, id string, lease, window time.Duration) (token int64, wait time.Duration, seq int64, err error) {
	args := []any{id, lease.Milliseconds(), window.Milliseconds()}
	if rl.opts.permits > 0 || rl.opts.shared {
		args = append(args, rl.opts.permits) // a fair semaphore; 0: a fair shared lock
	}
	reply, err := rl.locker.store.Run(ctx, rl.waited(store.FairAcquire, lease), rl.fairKeys(), args...)
	if err != nil {
		return 0, 0, 0, err
	}
	return store.ParseFairAcquire(reply, rl.fenced())
}

// attemptNow is a fair lock's first acquisition: one attempt that does not
// queue.
func (rl *RedisLock) attemptNow(ctx context.Context, id string, lease time.Duration, _ bool) (int64, time.Duration, error) {
	token, pttl, _, err := rl.attemptFair(ctx, id, lease, 0)
	return token, pttl, err
}

// fairStep makes one step of the fair wait of fw, under rl.op: it re-enters
// a hold that another call of rl took meanwhile, takes over the lock that
// m (when not nil) handed to fw, or makes an attempt that keeps fw queued.
// It reports done when the wait is over, err saying how; otherwise, how
// long to wait before the next attempt.
func (rl *RedisLock) fairStep(ctx, holding context.Context, fw *fairWaiter, m *store.Handoff) (done bool, wait time.Duration, err error) {
	if err := rl.lockOp(ctx); err != nil {
		return false, 0, opErr("acquire", rl.key, err)
	}
	defer rl.unlockOp()
	if counting, ok, err := rl.reenterCounting(ctx, holding); counting {
		// Not ok without an error: the hold was released meanwhile, and
		// the lock, taken by another, is to be waited for again.
		return ok || err != nil, 0, err
	}
	// A handoff counts if it is of fw's latest place in the queue, and the
	// lease it gave is still ahead by our accounting: the key was set
	// after the latest round trip that found fw waiting was sent. With
	// WithReplicas, the attempt below takes it over once the replicas have
	// it.
	if m != nil && m.Seq == fw.seq && rl.locker.clock.Now().Before(fw.until) && rl.opts.replicas == 0 {
		return true, 0, rl.takeOver(holding, fw, m.Token, fw.until)
	}
	sent := rl.locker.clock.Now()
	token, wait, seq, err := rl.attemptFair(ctx, fw.id, fw.lease, fw.lease)
	switch {
	case err != nil: // not replicated (lagging): the lock may be fw's, for the wait's next attempt to take over
		rl.countAcquire(false, false, err)
		return false, 0, opErr("acquire", rl.key, err)
	case token >= 0:
		return true, 0, rl.takeOver(holding, fw, token, sent.Add(fw.lease-renew.Margin(fw.lease)))
	}
	rl.countAcquire(false, false, nil)
	if seq > 0 { // waiting: a handoff to fw comes after this round trip
		fw.seq = seq
		fw.until = clock.Later(fw.until, sent.Add(fw.lease-renew.Margin(fw.lease)))
	}
	return false, wait, nil
}

// takeOver begins the hold of the lock fw was handed or took, valid until
// until by our accounting, with holding as its holding context.
func (rl *RedisLock) takeOver(holding context.Context, fw *fairWaiter, token int64, until time.Time) error {
	if err := rl.beginHold(holding, fw.id, fw.lease, token, until); err != nil {
		return opErr("acquire", rl.key, err) // the wait's end gives the lock back
	}
	fw.taken = true
	rl.countAcquire(false, true, nil)
	return nil
}
