package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/renew"
	"github.com/redislock/redislock/internal/store"
	"github.com/redislock/redislock/internal/wake"
)

// NewRedisLock returns a RedisLock on key, stored through store. Invalid
// arguments are not reported here but by the first call that needs them.
func NewRedisLock(store Scripter, key string, opts ...Option) *RedisLock {
	return newRedisLock(store, key, nil, opts)
}

// newRedisLock makes a lock of locker, or of its store's default Locker
// when locker is nil.
func newRedisLock(s Scripter, key string, locker *Locker, opts []Option) *RedisLock {
	o := options{expiry: DefaultExpiry, watchdog: true, clock: clock.Real{}, retry: DefaultRetry}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	name := key
	key = o.prefix + key
	holders := relatedName(key, "holders")
	acquireKeys := []string{key, relatedName(key, "abandoned"), holders}
	if o.fencing {
		acquireKeys = append(acquireKeys, relatedName(key, "fence"))
	}
	rl := &RedisLock{key: key, opts: o, mode: plainMode, op: make(chan struct{}, 1), names: names{
		acquire: acquireKeys,
		release: []string{key, relatedName(key, "releases"), holders},
		renew:   []string{key},
		channel: relatedName(key, "released"),
		holders: holders,
	}}
	rl.labels = labelsOf(rl.kind(), o.prefix)
	if o.permits > 0 || o.shared {
		rl.names.renew = []string{key, holders}
	}
	if o.fair {
		rl.names.queue, rl.names.waiters = relatedName(key, "queue"), relatedName(key, "waiters")
		// The counter too, fenced or not: the waiter handed the lock may be.
		rl.names.release = []string{key, rl.names.release[1], rl.names.queue, rl.names.waiters, relatedName(key, "fence"), holders}
		rl.line, rl.mode = &fairLine{turn: make(chan struct{}, 1)}, fairMode
	}
	if o.permits > 0 || o.shared {
		if !o.fair {
			rl.mode = permitMode // a fair semaphore's scripts are a fair lock's
		}
	}
	switch {
	case store.IsNil(s):
		rl.err = ErrNilStore
	case name == "":
		rl.err = ErrEmptyKey
	case len(key) > MaxKeyLen:
		rl.err = fmt.Errorf("%w: %d bytes (at most %d)", ErrKeyTooLong, len(key), MaxKeyLen)
	case reservedKey(key):
		rl.err = fmt.Errorf("%w: %q", ErrReservedKey, key)
	default:
		rl.err = cmp.Or(o.err(), permitsErr(o))
	}
	if locker == nil {
		locker = defaultLocker(s, o.clock)
	}
	rl.locker = locker
	if o.replicas > 0 && rl.err == nil && !locker.store.CanWait() {
		var client any = s
		if c, ok := store.Client(s); ok {
			client = c
		}
		rl.err = fmt.Errorf("%w: WithReplicas(%d): %w: the store (%T) cannot send WAIT after a script on its key's primary",
			ErrNotReplicated, o.replicas, errors.ErrUnsupported, client)
	}
	if !o.pubsubSet {
		rl.opts.pubsub = locker.store.Sub // wake-ups through the same client, if it has pub/sub
	}
	rl.expiry.Store(int64(o.expiry))
	return rl
}

// SetExpire sets the lease to seconds*1000+500 milliseconds, as go-zero's
// RedisLock does. It applies from the next first acquisition; a hold keeps
// the lease it began with. A negative or absurd value is reported as
// ErrInvalidExpiry by Acquire.
func (rl *RedisLock) SetExpire(seconds int) {
	if rl == nil {
		return
	}
	d := time.Duration(max(seconds, -1<<31)) * time.Second // negative: the error shows it
	if seconds >= 0 && seconds <= int(MaxExpiry/time.Second) {
		d = time.Duration(seconds*millisPerSecond+tolerance) * time.Millisecond
	} else if seconds > 0 {
		d = MaxExpiry + time.Second // too long, whatever it was
	}
	rl.expiry.Store(int64(d))
}

// Key returns the lock's Redis key.
func (rl *RedisLock) Key() string {
	if rl == nil {
		return ""
	}
	return rl.key
}

// Acquire is AcquireCtx with context.Background: the hold is renewed until
// it is released, lost, or reaches the maximum hold.
func (rl *RedisLock) Acquire() (bool, error) {
	return rl.AcquireCtx(context.Background())
}

// AcquireCtx makes one attempt to take the lock, within ctx: true, nil
// when it took the lock or re-entered it; false, nil when another owner
// holds it (a key of another type counts as held; for a semaphore or a
// shared lock, and for a lock on a semaphore's key, it is ErrWrongKind);
// false and an error otherwise (ErrRefused when Redis refused a command
// it needed; an ended ctx sends nothing). ctx is the holding context of a
// first acquisition: when it ends, renewal stops and the lock lasts out
// its lease (Done closes then, Err says why). A first acquisition whose reply came after its lease
// ran out by our own accounting, or a re-entry that finds the key gone,
// ends the hold with ErrLockLost. See docs/semantics.md.
func (rl *RedisLock) AcquireCtx(ctx context.Context) (bool, error) {
	if err := rl.check(ctx); err != nil {
		return false, err
	}
	ok, _, err := rl.acquireCtx(ctx, ctx, false)
	return ok, err
}

// Release is ReleaseCtx with context.Background.
func (rl *RedisLock) Release() (bool, error) {
	return rl.ReleaseCtx(context.Background())
}

// ReleaseCtx gives back one acquisition: true, nil when it did; the last
// one ends the hold (Done closes), then deletes the key, and nothing renews
// it after ReleaseCtx returns. It reports false, nil when nothing is held,
// and false with the reason for an acquisition of a hold that had ended.
// With an ended ctx, or when Redis cannot be reached, the acquisition is
// given back all the same, the error returned, and the key expires with its
// lease. See docs/semantics.md.
func (rl *RedisLock) ReleaseCtx(ctx context.Context) (bool, error) {
	return rl.releaseOf(ctx, nil)
}

// TTL returns the remaining lease of the key as Redis sees it, checked
// against our id: ErrNotHeld when this RedisLock holds nothing. When the key
// turns out to be gone or taken, the hold ends with ErrLockLost and the error
// matches both; so does every TTL after a hold ended, with its reason, until
// its acquisitions are released. A negative duration means someone removed
// the key's expiry. Of a semaphore or a shared lock, it is the holder's own
// lease, by the server's clock, whatever the key's expiry.
func (rl *RedisLock) TTL(ctx context.Context) (time.Duration, error) {
	if err := rl.check(ctx); err != nil {
		return 0, err
	}
	if err := rl.lockOp(ctx); err != nil {
		return 0, opErr("ttl", rl.key, err)
	}
	defer rl.unlockOp()

	if err := rl.endedHoldErr(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrNotHeld, err) // as every call says until it is released
	}
	rl.mu.Lock()
	h := rl.liveHold()
	rl.mu.Unlock()
	if h == nil {
		return 0, ErrNotHeld
	}
	reply, err := rl.locker.store.Run(ctx, store.TTL, []string{rl.key, rl.names.holders}, h.id)
	if err != nil {
		return 0, opErr("ttl", rl.key, err)
	}
	left, ours, err := store.ParseTTL(reply)
	switch {
	case err != nil:
		return 0, opErr("ttl", rl.key, err)
	case !ours:
		rl.mu.Lock()
		err := rl.endLocked(h, rl.lostErr("the key is gone or taken"))
		rl.mu.Unlock()
		return 0, fmt.Errorf("%w: %w", ErrNotHeld, err)
	}
	return left, nil // -1: no expiry
}

// newLocker returns a Locker of s on c whose locks have opts as defaults,
// that logs to log (nil: its store's default).
func newLocker(s Scripter, c clock.Clock, opts []Option, shared bool, log *slog.Logger) *Locker {
	if log == nil && store.IsGoZero(s) {
		log = logxLogger
	}
	l := &Locker{store: store.New(s), opts: opts, clock: c, log: log, wake: wake.NewSet(c, log)}
	l.life.shared, l.life.finished = shared, make(chan struct{})
	l.life.closing, l.life.shut = context.WithCancel(context.Background())
	l.renewals = renew.New(c, l.store, leaseEnded, countRenewals, renewalFailed)
	return l
}

// defaultLockers holds the default Locker of each store (each client, for
// FromGoRedis), both weakly: a Locker lives as long as its locks, and a
// store dropped with its locks takes its Locker with it.
var defaultLockers struct {
	sync.Mutex
	m map[weak.Pointer[byte]]weak.Pointer[Locker]
}

// defaultLocker returns store's default Locker on c: one per store (per
// client, for FromGoRedis) on the real clock, while any of its locks
// lives; one per lock on another clock (a test's) or for a store that is
// not a pointer.
func defaultLocker(s Scripter, c clock.Clock) *Locker {
	key := reflect.ValueOf(s)
	if client, ok := store.Client(s); ok {
		key = reflect.ValueOf(client) // a pointer, as a rule
	}
	if _, real := c.(clock.Real); !real || store.IsNil(s) || key.Kind() != reflect.Pointer {
		return newLocker(s, c, nil, true, nil)
	}
	ptr := (*byte)(key.UnsafePointer())
	wk := weak.Make(ptr)
	d := &defaultLockers
	d.Lock()
	defer d.Unlock()
	if l := d.m[wk].Value(); l != nil {
		return l
	}
	l := newLocker(s, c, nil, true, nil)
	if d.m == nil {
		d.m = map[weak.Pointer[byte]]weak.Pointer[Locker]{}
	}
	d.m[wk] = weak.Make(l)
	runtime.AddCleanup(l, func(wk weak.Pointer[byte]) {
		d.Lock()
		defer d.Unlock()
		if d.m[wk].Value() == nil { // not a newer Locker's
			delete(d.m, wk)
		}
	}, wk)
	return l
}
