package redislock

import (
	"context"
	"errors"
	"fmt"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
)

// NewLocker returns a Locker of store whose locks have opts as defaults.
func NewLocker(store Scripter, opts ...Option) *Locker {
	o := options{clock: clock.Real{}}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return newLocker(store, o.clock, opts, false, o.logger)
}

// NewLock returns a lock on key, within the Locker's prefix. opts override
// the Locker's defaults. As with NewRedisLock, invalid arguments are
// reported by the first call that needs them.
func (l *Locker) NewLock(key string, opts ...Option) *RedisLock {
	if l == nil || l.life.closing == nil {
		return NewRedisLock(nil, key) // reports ErrNilStore
	}
	all := make([]Option, 0, len(l.opts)+len(opts))
	return newRedisLock(l.store.Scripter, key, l, append(append(all, l.opts...), opts...))
}

// lockerKey is the context key under which Do keeps the lock of a key.
type lockerKey struct {
	l   *Locker
	key string
}

// Do runs fn while holding the lock on key, as RedisLock.Do does. fn's
// context carries the lock, so a Do of the same Locker and key inside fn,
// with fn's context or one derived from it, re-enters it instead of waiting
// for itself; elsewhere, each call of Do makes a lock of its own.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context) error) error {
	if ctx == nil {
		return ErrNilContext
	}
	k := lockerKey{l, key}
	rl, ok := ctx.Value(k).(*RedisLock)
	if !ok {
		rl = l.NewLock(key)
		ctx = context.WithValue(ctx, k, rl)
	}
	return rl.Do(ctx, fn)
}

// Close ends every hold still held by the Locker's locks, all at once: each
// ends with ErrLockerClosed (Done closes, Err says so) before any key is
// released. Then it releases their keys, within two seconds in all (with a
// client that honours context deadlines, as go-redis does with
// ContextTimeoutEnabled). Waits of its locks give up, and their later
// acquisitions fail, with ErrLockerClosed. It returns once nothing of the
// Locker runs any more: no renewal, give-back or subscription, and no wait
// (a wait's call under way ends at the client's timeout for that call, not
// retried, and what the wait then gives back, such as a fair wait's place,
// gets two seconds); with the errors of the releases that failed (those
// keys expire with their leases), and ErrLockLost for a key found gone or
// taken. A Close of a closed Locker returns nil once the first Close has
// returned.
func (l *Locker) Close() error {
	if l == nil || l.life.closing == nil {
		return ErrNilStore
	}
	l.life.mu.Lock()
	select {
	case <-l.life.closing.Done():
		l.life.mu.Unlock()
		<-l.life.finished // another Close's
		return nil
	default:
	}
	l.life.shut()
	defer close(l.life.finished)
	l.life.mu.Unlock()
	held := map[*hold]bool{}
	for _, h := range l.renewals.Close() { // no hold begins any more
		held[h] = true
	}

	// Every hold ends first, at once; then the keys are released, in one
	// pipeline per server, so that a stalled release holds up no hold's end.
	for h := range held {
		rl := h.rl
		rl.mu.Lock()
		if !h.live() {
			delete(held, h)
		}
		rl.endLocked(h, fmt.Errorf("%w: %q", ErrLockerClosed, rl.key))
		rl.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), selfReleaseTimeout) // for them all
	defer cancel()
	calls := make([]*store.Call, 0, len(held))
	for h := range held {
		calls = append(calls, h.rl.releaseCall(ctx, h.id, 0))
	}
	l.store.RunAll(ctx, calls, func(done []*store.Call) {
		for _, c := range done {
			// A renewal under way is owner-checked: it cannot bring back or
			// extend the key this deletes, so it is not waited for.
			switch code, err := l.releaseResult(c); {
			case err != nil:
				l.failed(opErr("release", c.Tag.(*RedisLock).key, err))
			case code == 0: // a loss, learnt only now
				l.failed(c.Tag.(*RedisLock).lostErr("Close's release found the key gone or taken"))
			}
		}
	})
	l.life.mu.Lock()
	l.life.joined = true
	l.life.mu.Unlock()
	l.wake.Close() // lingering channels; a hub with waiters closes as its last one leaves
	l.renewals.Wait()
	l.life.wg.Wait() // give-backs, self-releases, and its locks' waits
	l.wake.Wait()
	l.life.mu.Lock()
	defer l.life.mu.Unlock()
	return errors.Join(l.life.late...)
}
