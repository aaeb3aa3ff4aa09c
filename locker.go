package redislock

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
)

// ErrLockerClosed reports a call on a lock of a Locker that was closed, and
// is why the holds it ended ended.
var ErrLockerClosed = errors.New("redislock: locker closed")

// A Locker makes the locks of one Redis client and owns what they share:
// one set of defaults, a key namespace (WithPrefix), and their lifetime:
// Close ends every hold still held. Make it with NewLocker; the zero value
// is not usable. A Locker is safe for concurrent use.
type Locker struct {
	store  Scripter
	opts   []Option
	shared any // its key in sharedLockers; nil for a Locker of NewLocker

	mu         sync.Mutex
	holds      map[*hold]*RedisLock // live holds of its locks (not for a shared Locker)
	closed     chan struct{}        // closed by Close
	schedulers map[clock]*renewals  // keep its holds' deadlines, by time source
	hubs       map[any]*hub         // its wake-up subscriptions, by Subscriber
	busy       int                  // schedulers with holds, and open hubs
}

// NewLocker returns a Locker of store whose locks have opts as defaults.
func NewLocker(store Scripter, opts ...Option) *Locker {
	return &Locker{
		store:      store,
		opts:       opts,
		holds:      map[*hold]*RedisLock{},
		closed:     make(chan struct{}),
		schedulers: map[clock]*renewals{},
		hubs:       map[any]*hub{},
	}
}

// sharedLockers holds the Lockers of the locks of NewRedisLock, one per
// store, while they hold or wait for anything: a store that no longer holds
// or waits is forgotten, so that nothing runs, and nothing is kept, for it.
var sharedLockers = struct {
	sync.Mutex
	m map[any]*Locker
}{m: map[any]*Locker{}}

// owner returns the Locker of rl: its own, or for a lock of NewRedisLock,
// the one its store shares (a new one if the store has none now; it is
// known to sharedLockers from the moment it holds or waits for anything).
// A store that cannot be compared gets a Locker per lock.
func (rl *RedisLock) owner() *Locker {
	if rl.locker != nil {
		return rl.locker
	}
	key := any(rl)
	if reflect.ValueOf(rl.store).Comparable() {
		key = rl.store
	}
	sharedLockers.Lock()
	defer sharedLockers.Unlock()
	if l := sharedLockers.m[key]; l != nil {
		return l
	}
	return &Locker{store: rl.store, shared: key} // its maps are made on first use
}

// knownOwner returns the Locker of rl if it has one now; nil for a lock of
// NewRedisLock whose store holds and waits for nothing.
func (rl *RedisLock) knownOwner() *Locker {
	if rl.locker != nil {
		return rl.locker
	}
	sharedLockers.Lock()
	defer sharedLockers.Unlock()
	if reflect.ValueOf(rl.store).Comparable() {
		if l := sharedLockers.m[rl.store]; l != nil {
			return l
		}
	}
	return sharedLockers.m[rl]
}

// busier counts a scheduler that has holds now (+1) or no longer (-1), a
// hub opened or closed. A shared
// Locker is known while busy.
func (l *Locker) busier(by int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busierLocked(by)
}

func (l *Locker) busierLocked(by int) {
	l.busy += by
	if l.shared == nil {
		return
	}
	sharedLockers.Lock()
	defer sharedLockers.Unlock()
	switch cur := sharedLockers.m[l.shared]; {
	case l.busy == 0 && cur == l:
		delete(sharedLockers.m, l.shared)
	case l.busy > 0 && cur == nil:
		sharedLockers.m[l.shared] = l
	}
}

// renewalsFor returns the scheduler of the Locker's holds on c.
func (l *Locker) renewalsFor(c clock) *renewals {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.schedulers[c]
	if s == nil {
		if l.schedulers == nil {
			l.schedulers = map[clock]*renewals{}
		}
		s = &renewals{clock: c, locker: l}
		l.schedulers[c] = s
	}
	return s
}

// NewLock returns a lock on key, within the Locker's prefix. opts override
// the Locker's defaults. As with NewRedisLock, invalid arguments are
// reported by the first call that needs them.
func (l *Locker) NewLock(key string, opts ...Option) *RedisLock {
	if l == nil || l.closed == nil {
		return NewRedisLock(nil, key) // reports ErrNilStore
	}
	all := make([]Option, 0, len(l.opts)+len(opts))
	rl := NewRedisLock(l.store, key, append(append(all, l.opts...), opts...)...)
	rl.locker = l
	return rl
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
// acquisitions fail, with ErrLockerClosed. It returns the errors of the
// releases that failed (those keys expire with their leases). Closing a
// closed Locker does nothing.
func (l *Locker) Close() error {
	if l == nil || l.closed == nil {
		return ErrNilStore
	}
	l.mu.Lock()
	select {
	case <-l.closed:
		l.mu.Unlock()
		return nil
	default:
	}
	close(l.closed)
	held := make(map[*hold]*RedisLock, len(l.holds))
	for h, rl := range l.holds {
		held[h] = rl
	}
	l.mu.Unlock()

	// Every hold ends first, at once; then the keys are released, from a
	// few goroutines at once, so that a stalled release holds up no other
	// hold's end.
	for h, rl := range held {
		rl.mu.Lock()
		if !h.live() {
			delete(held, h)
		}
		rl.endLocked(h, fmt.Errorf("%w: %q", ErrLockerClosed, rl.key))
		rl.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), selfReleaseTimeout) // for them all
	defer cancel()
	var mu sync.Mutex
	var errs []error
	work := make(chan *hold)
	var wg sync.WaitGroup
	for range min(len(held), closeWorkers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for h := range work {
				if err := l.closeHold(ctx, h, held[h]); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for h := range held {
		work <- h
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// closeWorkers is how many of Close's releases are under way at once.
const closeWorkers = 32

// closeHold releases the key of h, a hold of rl that Close ended.
func (l *Locker) closeHold(ctx context.Context, h *hold, rl *RedisLock) error {
	// A renewal under way is owner-checked: it cannot bring back or extend
	// the key this deletes, so it is not waited for.
	if _, err := rl.release(ctx, h.id, 0); err != nil {
		return opErr("release", rl.key, err)
	}
	return nil
}

// isClosed reports whether Close was called.
func (l *Locker) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

// track records a live hold of rl; false when the Locker is closed.
func (l *Locker) track(rl *RedisLock, h *hold) bool {
	if l.shared != nil {
		return true // never closed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isClosed() {
		return false
	}
	l.holds[h] = rl
	return true
}

// forget drops a hold that ended.
func (l *Locker) forget(h *hold) {
	if l.shared != nil {
		return
	}
	l.mu.Lock()
	delete(l.holds, h)
	l.mu.Unlock()
}
