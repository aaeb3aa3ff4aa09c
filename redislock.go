// Package redislock is a distributed, reentrant, self-renewing mutual
// exclusion lock on Redis, shaped like go-zero's redis.RedisLock.
//
// A lock is one Redis string key holding its owner's random id, taken with
// SET NX PX and deleted by an owner-checked script, so it interoperates with
// go-zero's RedisLock and the classic recipe. On top of that, a RedisLock
// counts re-entries, renews its lease in the background while held, and
// tells its holder at once, through Done and Err, when the hold ends for any
// reason other than its own Release.
package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

const (
	millisPerSecond = 1000
	// tolerance is what go-zero adds to SetExpire's seconds, in ms.
	tolerance = 500
	// selfReleaseTimeout bounds the release made in the background when the
	// holding context ends or the maximum hold is reached.
	selfReleaseTimeout = 2 * time.Second
)

// A RedisLock is a lock on one Redis key. Make it with NewRedisLock; the zero
// value is not usable (its methods report ErrNilStore). A RedisLock must not
// be copied after first use.
//
// Ownership belongs to the RedisLock value, not to a goroutine: every
// goroutine that calls Acquire on the same RedisLock shares its hold, and any
// of them may Release it. Independent workers that must exclude each other
// need a RedisLock each, even in one process.
//
// A RedisLock is safe for concurrent use; calls that talk to Redis (Acquire,
// Release, TTL) are serialized, while Done, Err, Holds and Key never block.
//
// A hold begins with a successful first acquisition and counts re-entries:
// n successful acquisitions need n releases, and the key is deleted on the
// last. It ends when the last hold is released, when the lock is lost, when
// the context given to the first acquisition ends, or at the maximum hold.
// After a hold ended for any reason but Release, the acquisitions it counted
// must still be released (each Release reports why it ended); until then
// Acquire fails with the same error, so a lost lock is never re-taken behind
// the back of code that believes it still holds it.
type RedisLock struct {
	store    Scripter
	evaler   Evaler // store, when it has EvalCtx
	key      string
	keys     []string // {key}, or {key, fencing counter}; shared by every script call
	err      error    // bad construction, reported by every call
	expiry   atomic.Int64
	maxHold  time.Duration
	watchdog bool
	clock    clock
	retry    RetryStrategy
	pubsub   Subscriber // nil: no wake-ups
	channel  string     // where releases are published

	op sync.Mutex // serializes the calls that talk to Redis

	mu   sync.Mutex // guards cur, owed and the fields of holds marked so
	cur  *hold      // the current or most recent hold
	owed int        // acquisitions counted by cur and not yet released
}

// hold is one tenure of the lock, from a first acquisition to its end.
type hold struct {
	id      string
	token   int64         // fencing token; 0 without WithFencing
	lease   time.Duration // fixed for the hold's life
	leaseMs int64
	started time.Time // when the first acquisition was sent
	parent  context.Context
	done    chan struct{} // closed when the hold ends
	timer   timer         // fires at until: the lease ran out
	wake    timer         // runs the watchdog when its next duty is due
	unbind  func() bool   // stops the context.AfterFunc on parent

	// Guarded by RedisLock.mu.
	until time.Time // when the lease ends by our own accounting

	// Set under RedisLock.mu by the watchdog's first run.
	ctx    context.Context    // ends with parent, or when the hold stops
	cancel context.CancelFunc // nil until the watchdog first runs

	running  bool          // a run of the watchdog is under way
	stepDone chan struct{} // closed when that run is over
	lastErr  error         // the latest renewal failure, since the last success
	stopping bool          // Release has asked the watchdog to stop
	ended    bool
	err      error // why it ended; nil after a normal release

	// Used by the watchdog's runs only, which never overlap.
	nextRenew time.Time
	failures  int // renewals failed in a row
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// NewRedisLock returns a RedisLock on key, stored through store. Invalid
// arguments are not reported here but by the first call that needs them.
func NewRedisLock(store Scripter, key string, opts ...Option) *RedisLock {
	o := options{expiry: DefaultExpiry, watchdog: true, clock: realClock{}, retry: DefaultRetry}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if g, ok := store.(goRedis); ok && !o.pubsubSet {
		o.pubsub, _ = g.c.(Subscriber) // wake-ups through the same client
	}
	keys := []string{key}
	if o.fencing {
		keys = append(keys, sameSlot(key, ":redislock:fence"))
	}
	rl := &RedisLock{
		store:    store,
		key:      key,
		keys:     keys,
		maxHold:  o.maxHold,
		watchdog: o.watchdog,
		clock:    o.clock,
		retry:    o.retry,
		pubsub:   o.pubsub,
		channel:  sameSlot(key, ":redislock:released"),
	}
	switch {
	case isNil(store):
		rl.err = ErrNilStore
	case key == "":
		rl.err = ErrEmptyKey
	case len(key) > MaxKeyLen:
		rl.err = fmt.Errorf("%w: %d bytes (at most %d)", ErrKeyTooLong, len(key), MaxKeyLen)
	default:
		rl.err = o.err
	}
	if e, ok := store.(Evaler); ok && !isNil(store) {
		rl.evaler = e
	}
	rl.expiry.Store(int64(o.expiry))
	return rl
}

// SetExpire sets the lease to seconds*1000+500 milliseconds, as go-zero's
// RedisLock does. It applies from the next first acquisition; a hold keeps
// the lease it began with. A negative or absurd value is reported as
// ErrInvalidExpiry by Acquire.
func (rl *RedisLock) SetExpire(seconds int) {
	d := time.Duration(-1)
	if seconds >= 0 && seconds <= int(MaxExpiry/time.Second) {
		d = time.Duration(seconds*millisPerSecond+tolerance) * time.Millisecond
	} else if seconds > 0 {
		d = MaxExpiry + time.Second // too long, whatever it was
	}
	rl.expiry.Store(int64(d))
}

// Key returns the lock's Redis key.
func (rl *RedisLock) Key() string { return rl.key }

// check reports a RedisLock that cannot be used, and a nil context.
func (rl *RedisLock) check(ctx context.Context) error {
	switch {
	case rl.err != nil:
		return rl.err
	case rl.store == nil || rl.clock == nil:
		return ErrNilStore
	case ctx == nil:
		return ErrNilContext
	}
	return nil
}

// Acquire is AcquireCtx with context.Background: the hold lasts until it is
// released, lost, or reaches the maximum hold.
func (rl *RedisLock) Acquire() (bool, error) {
	return rl.AcquireCtx(context.Background())
}

// AcquireCtx makes one attempt to take the lock. It reports true, nil when
// the lock was taken, or re-entered by this RedisLock; false, nil when
// another owner holds it; and false with an error otherwise.
//
// A first acquisition is one SET NX PX on Redis. ctx then binds the hold:
// when ctx ends, the watchdog stops, Done is closed, Err reports
// context.Cause(ctx), and then the lock is released in the background. A re-entry is one round
// trip that verifies ownership and refreshes the lease; ctx bounds only that
// round trip. A re-entry that finds the key gone or taken ends the hold with
// ErrLockLost and returns it.
func (rl *RedisLock) AcquireCtx(ctx context.Context) (bool, error) {
	if err := rl.check(ctx); err != nil {
		return false, err
	}
	ok, _, err := rl.acquireCtx(ctx)
	return ok, err
}

// countAcquire records an acquisition attempt's result.
func countAcquire(reentry, ok bool, err error) {
	switch {
	case ok && reentry:
		metricAcquisitions.Inc("reentered")
	case ok:
		metricAcquisitions.Inc("acquired")
	case errors.Is(err, ErrLockLost), errors.Is(err, ErrMaxHoldExceeded):
		metricAcquisitions.Inc("lost")
	case err != nil:
		metricAcquisitions.Inc("error")
	default:
		metricAcquisitions.Inc("busy")
	}
}

// acquireCtx is AcquireCtx, also returning the holder's remaining lease when
// another owner holds the lock (negative when its key has no expiry).
func (rl *RedisLock) acquireCtx(ctx context.Context) (bool, time.Duration, error) {
	rl.op.Lock()
	defer rl.op.Unlock()

	rl.mu.Lock()
	h := rl.cur
	if rl.owed > 0 {
		if h.ended {
			err := h.err
			rl.mu.Unlock()
			countAcquire(true, false, err)
			return false, 0, err
		}
		rl.mu.Unlock()
		ok, err := rl.reenter(ctx, h)
		countAcquire(true, ok, err)
		return ok, 0, err
	}
	rl.mu.Unlock()

	lease := time.Duration(rl.expiry.Load())
	if err := validExpiry(lease); err != nil {
		return false, 0, err
	}
	ok, pttl, err := rl.acquire(ctx, lease)
	countAcquire(false, ok, err)
	return ok, pttl, err
}

// acquire makes a first acquisition. The caller holds rl.op.
func (rl *RedisLock) acquire(ctx context.Context, lease time.Duration) (bool, time.Duration, error) {
	id := newID()
	leaseMs := lease.Milliseconds()
	sent := rl.clock.Now()
	reply, err := rl.run(ctx, acquireScript, id, leaseMs)
	if err != nil {
		return false, 0, fmt.Errorf("redislock: acquire %q: %w", rl.key, err)
	}
	token, pttl, err := rl.parseAcquire(reply)
	switch {
	case err != nil:
		return false, 0, fmt.Errorf("redislock: acquire %q: %w", rl.key, err)
	case token < 0:
		return false, pttl, nil // held by another owner
	}
	if ctx.Err() != nil {
		// The caller gave up while the lock was being taken: give it back.
		rl.releaseQuietly(ctx, id)
		return false, 0, fmt.Errorf("redislock: acquire %q: %w", rl.key, context.Cause(ctx))
	}

	h := &hold{
		id:      id,
		token:   token,
		lease:   lease,
		leaseMs: leaseMs,
		started: sent,
		parent:  ctx,
		done:    make(chan struct{}),
		until:   sent.Add(lease - drift(lease)),
	}
	rl.mu.Lock()
	rl.cur, rl.owed = h, 1
	metricHeld.Inc()
	now := rl.clock.Now()
	h.timer = rl.clock.AfterFunc(h.until.Sub(now), func() { rl.leaseRanOut(h) })
	if first := rl.firstDuty(h); !first.IsZero() {
		h.wake = rl.clock.WatchFunc(first.Sub(now), func() { rl.watch(h) })
	}
	if ctx.Done() != nil {
		h.unbind = context.AfterFunc(ctx, func() { rl.watch(h) })
	}
	rl.mu.Unlock()
	return true, 0, nil
}

// reenter counts one more acquisition of a live hold. The caller holds rl.op.
func (rl *RedisLock) reenter(ctx context.Context, h *hold) (bool, error) {
	sent := rl.clock.Now()
	ok, err := rl.extend(ctx, h.id, h.leaseMs)
	if err != nil {
		return false, fmt.Errorf("redislock: re-enter %q: %w", rl.key, err)
	}
	rl.mu.Lock()
	if !ok {
		err := rl.endLocked(h, rl.lostErr("re-entry found the key gone or taken"))
		rl.mu.Unlock()
		return false, err
	}
	if h.ended {
		// The hold ended while we were extending it (lease ran out, maximum
		// hold, holding context): the key we just extended is no longer
		// ours to keep.
		err := h.err
		rl.mu.Unlock()
		rl.releaseQuietly(ctx, h.id)
		return false, err
	}
	rl.owed++
	rl.extendedLocked(h, sent)
	rl.mu.Unlock()
	return true, nil
}

// Release is ReleaseCtx with context.Background.
func (rl *RedisLock) Release() (bool, error) {
	return rl.ReleaseCtx(context.Background())
}

// ReleaseCtx gives back one acquisition. It reports true, nil when one was
// given back; the key is deleted only with the last, after the watchdog has
// stopped, so no renewal runs once ReleaseCtx returns. It reports false, nil
// when this RedisLock holds nothing, and false with the reason (ErrLockLost,
// ErrMaxHoldExceeded, or the holding context's cause) for an acquisition of a
// hold that had already ended.
//
// If the final release cannot reach Redis, the hold ends all the same and
// ReleaseCtx returns the error: nothing renews the key any more, and it
// expires at the end of its lease.
func (rl *RedisLock) ReleaseCtx(ctx context.Context) (bool, error) {
	if err := rl.check(ctx); err != nil {
		return false, err
	}
	rl.op.Lock()
	defer rl.op.Unlock()

	rl.mu.Lock()
	h := rl.cur
	switch {
	case rl.owed == 0:
		rl.mu.Unlock()
		return false, nil
	case h.ended:
		rl.owed--
		err, running := h.err, h.running
		stepDone := h.stepDone
		rl.mu.Unlock()
		if running { // it was cancelled when the hold ended; let it finish
			<-stepDone
		}
		return false, err
	case rl.owed > 1:
		rl.owed--
		rl.mu.Unlock()
		return true, nil
	}
	// The last hold: stop the watchdog, wait for it, then delete the key.
	h.stopping = true
	h.stopLocked()
	running, stepDone := h.running, h.stepDone
	rl.mu.Unlock()
	if running {
		<-stepDone
	}

	rl.mu.Lock()
	if h.ended { // ended while stopping: holding context, loss, maximum hold
		rl.owed = 0
		err := h.err
		rl.mu.Unlock()
		return false, err
	}
	rl.mu.Unlock()

	deleted, err := rl.release(ctx, h.id)

	rl.mu.Lock()
	defer rl.mu.Unlock()
	rl.owed = 0
	switch {
	case err != nil:
		rl.endLocked(h, nil)
		return false, fmt.Errorf("redislock: release %q: %w", rl.key, err)
	case !deleted:
		return false, rl.endLocked(h, rl.lostErr("release found the key gone or taken"))
	}
	if err := rl.endLocked(h, nil); err != nil {
		return false, err // the lease ran out while the release was under way
	}
	return true, nil
}

// TTL returns the remaining lease of the key as Redis sees it, checked
// against our id: ErrNotHeld when this RedisLock holds nothing. When the key
// turns out to be gone or taken, the hold ends with ErrLockLost and the error
// matches both. A negative duration means someone removed the key's expiry.
func (rl *RedisLock) TTL(ctx context.Context) (time.Duration, error) {
	if err := rl.check(ctx); err != nil {
		return 0, err
	}
	rl.op.Lock()
	defer rl.op.Unlock()

	rl.mu.Lock()
	h := rl.cur
	live := rl.owed > 0 && !h.ended
	rl.mu.Unlock()
	if !live {
		return 0, ErrNotHeld
	}
	ms, err := rl.runInt(ctx, ttlScript, h.id)
	switch {
	case err != nil:
		return 0, fmt.Errorf("redislock: ttl %q: %w", rl.key, err)
	case ms == -2:
		rl.mu.Lock()
		err := rl.endLocked(h, rl.lostErr("the key is gone or taken"))
		rl.mu.Unlock()
		return 0, fmt.Errorf("%w: %w", ErrNotHeld, err)
	case ms < -2:
		return 0, fmt.Errorf("redislock: ttl %q: %w: %d", rl.key, ErrUnexpectedReply, ms)
	case ms == -1:
		return -1, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Token returns the fencing token of the live hold (see WithFencing): 0 when
// nothing is held or the lock is not fenced.
func (rl *RedisLock) Token() int64 {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil || rl.cur.ended || rl.owed == 0 {
		return 0
	}
	return rl.cur.token
}

// Until returns the end of the live hold's lease by the holder's own
// conservative accounting: the time the latest successful acquisition,
// re-entry or renewal was sent, plus the lease, less a margin of 1% + 2ms.
// Redis may keep the key a little longer, never shorter, as long as clocks
// run at the same rate. It is the zero time when nothing is held.
func (rl *RedisLock) Until() time.Time {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil || rl.cur.ended || rl.owed == 0 {
		return time.Time{}
	}
	return rl.cur.until
}

// Holds returns how many acquisitions the live hold counts: 0 when nothing
// is held, including after the hold ended.
func (rl *RedisLock) Holds() int {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil || rl.cur.ended {
		return 0
	}
	return rl.owed
}

// Done returns a channel that is closed when the current hold ends: its last
// release, loss, the end of its holding context, or the maximum hold. It is
// already closed when nothing is held. A new hold has a new channel.
func (rl *RedisLock) Done() <-chan struct{} {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil {
		return closedChan
	}
	return rl.cur.done
}

// Err returns nil while the lock is held, when nothing was held, and after a
// normal release. Otherwise it returns why the latest hold ended: an error
// matching ErrLockLost or ErrMaxHoldExceeded, or the holding context's cause.
func (rl *RedisLock) Err() error {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil || !rl.cur.ended {
		return nil
	}
	return rl.cur.err
}

// endLocked ends h once, with cause, and returns the cause it ended with.
// The caller holds rl.mu.
func (rl *RedisLock) endLocked(h *hold, cause error) error {
	if h.ended {
		return h.err
	}
	h.ended, h.err = true, cause
	h.timer.Stop()
	h.stopLocked()
	close(h.done)
	rl.countEnd(h, cause)
	switch {
	case errors.Is(cause, ErrLockLost), errors.Is(cause, ErrMaxHoldExceeded):
		logx.Errorf("redislock: hold of %q (owner %s) ended: %v", rl.key, h.id, cause)
	case cause != nil: // the holding context ended: the holder asked for it
		logx.Infof("redislock: hold of %q (owner %s) ended with its context: %v", rl.key, h.id, cause)
	}
	return cause
}

// stopLocked cancels the watchdog's run under way, if any, and whatever
// would start another. The caller holds rl.mu.
func (h *hold) stopLocked() {
	if h.wake != nil {
		h.wake.Stop()
	}
	if h.unbind != nil {
		h.unbind()
	}
	if h.cancel != nil {
		h.cancel()
	}
}

// extendedLocked records a successful acquisition or renewal sent at sent.
// The caller holds rl.mu.
func (rl *RedisLock) extendedLocked(h *hold, sent time.Time) {
	if until := sent.Add(h.lease - drift(h.lease)); until.After(h.until) {
		h.until = until
	}
	h.lastErr = nil
}

// leaseRanOut runs when h's lease may have run out by our own accounting.
func (rl *RedisLock) leaseRanOut(h *hold) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if h.ended {
		return
	}
	if left := h.until.Sub(rl.clock.Now()); left > 0 {
		h.timer.Reset(left) // renewed in the meantime
		return
	}
	var err error
	switch {
	case h.lastErr != nil:
		err = fmt.Errorf("%w: %q: %w while renewals failed: %w", ErrLockLost, rl.key, errLeaseRanOut, h.lastErr)
	case rl.watchdog:
		err = fmt.Errorf("%w: %q: %w before a renewal got through", ErrLockLost, rl.key, errLeaseRanOut)
	default:
		err = fmt.Errorf("%w: %q: %w: %v (no watchdog)", ErrLockLost, rl.key, errLeaseRanOut, h.lease)
	}
	rl.endLocked(h, err)
}

func (rl *RedisLock) lostErr(why string) error {
	return fmt.Errorf("%w: %q: %s", ErrLockLost, rl.key, why)
}

// releaseQuietly deletes the key if id still owns it, for a hold that is
// over already, within selfReleaseTimeout, and logs a failure.
func (rl *RedisLock) releaseQuietly(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), selfReleaseTimeout)
	defer cancel()
	if _, err := rl.release(ctx, id); err != nil {
		logx.Errorf("redislock: releasing %q (owner %s) failed, it expires with its lease: %v", rl.key, id, err)
	}
}
