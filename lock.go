package redislock

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/renew"
	"github.com/redislock/redislock/internal/store"
	"github.com/redislock/redislock/internal/wake"
)

// A RedisLock is a lock on one Redis key. Make it with NewRedisLock; the zero
// value and a nil *RedisLock are not usable (their methods report
// ErrNilStore, or hold nothing). A RedisLock must not
// be copied after first use.
//
// Ownership belongs to the RedisLock value, not to a goroutine: every
// goroutine that calls Acquire on the same RedisLock shares its hold, and any
// of them may Release it. Independent workers that must exclude each other
// need a RedisLock each, even in one process.
//
// A RedisLock is safe for concurrent use; calls that talk to Redis (Acquire,
// Release, TTL) are serialized, each waiting for its turn within its own
// context, while Done, Err, Holds, Until, Token, Owner and Key never block.
// Inspect, Break and Watch need no hold and do not wait for the others.
//
// A hold begins with a successful first acquisition and counts re-entries:
// n successful acquisitions need n releases, and the key is deleted on the
// last. It ends when the last acquisition is released, when the lock is
// lost, at the maximum hold, or when its lease runs out after the context
// given to the first acquisition ended (that context bounds the renewal, not
// the lock). After a hold ended for any reason but Release, the
// acquisitions it counted must still be released (each Release reports why
// it ended); until then Acquire fails with the same error, so a lost lock is
// never re-taken behind the back of code that believes it still holds it.
type RedisLock struct {
	key    string
	names  names         // of its related keys and channel
	err    error         // bad construction, reported by every call
	opts   options       // as made; its lease is expiry's
	expiry atomic.Int64  // the lease of the next first acquisition (SetExpire)
	locker *Locker       // its own, or its store's default Locker
	mode   *mode         // its kind's scripts
	labels *labels       // of its metrics' series
	line   *fairLine     // a fair lock's waits; nil for others
	op     chan struct{} // a token that serializes the calls that talk to Redis, taken within their context

	// Locks are taken in this order: a RedisLock's mu, then its Locker's
	// scheduler's or wake-up Set's. A RedisLock's mu is never held over a
	// call to Redis.
	mu    sync.Mutex    // guards cur, began, line's waits and parked, and the fields of holds marked so
	cur   *hold         // the current or most recent hold
	began chan struct{} // closed when the next hold begins; made by heldChange
}

// names are the Redis names a lock uses beside its key.
type names struct {
	acquire []string // key, abandoned attempts, holders[, fencing counter]
	release []string // key, record of recent releases[, queue, waiters, fencing counter], holders
	renew   []string // key; and holders, of a semaphore or a shared lock
	holders string   // a semaphore's or a shared lock's sorted set of holders
	channel string   // where releases are published
	queue   string   // a fair lock's queue of waiters
	waiters string   // a fair lock's hash of its waiters' liveness
}

// check reports a RedisLock that cannot be used, and a nil context.
func (rl *RedisLock) check(ctx context.Context) error {
	switch {
	case rl == nil:
		return ErrNilStore
	case rl.err != nil:
		return rl.err
	case rl.locker == nil || rl.op == nil:
		return ErrNilStore
	case ctx == nil:
		return ErrNilContext
	}
	return nil
}

// lockOp takes the token of the calls that talk to Redis, within ctx.
func (rl *RedisLock) lockOp(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case rl.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (rl *RedisLock) unlockOp() { <-rl.op }

// lockerClosed reports whether rl's Locker was closed.
func (rl *RedisLock) lockerClosed() bool {
	return rl.locker.isClosed()
}

// fenced reports whether rl mints fencing tokens.
func (rl *RedisLock) fenced() bool { return len(rl.names.acquire) > 3 }

// waited returns script followed by WAIT for the replicas of WithReplicas,
// for a hold with a lease of lease.
func (rl *RedisLock) waited(script *store.Script, lease time.Duration) *store.Script {
	return script.Replicated(store.Replicas{N: rl.opts.replicas, Timeout: replicasTimeout(lease)})
}

// A mode is what a lock's kind changes in its calls: how a first
// acquisition is attempted, alone or for a wait (its fencing token, or -1
// and how long the holder's lease has left), and the scripts that release
// and renew its holds.
type mode struct {
	take    func(rl *RedisLock, ctx context.Context, id string, lease time.Duration, waiting bool) (token int64, pttl time.Duration, err error)
	release *store.Script
}

// fairLine is what the fair waits of one RedisLock share: one waits at a
// time (turn), and a place in the queue left by a call that gave up passes
// to the next (parked). waits and parked are guarded by RedisLock.mu.
type fairLine struct {
	turn   chan struct{}
	waits  int         // AcquireWait calls under way
	parked *fairWaiter // a place in the queue, left to the next call
}

// A fairWaiter is a fair wait's place in the key's queue in Redis.
type fairWaiter struct {
	id    string
	lease time.Duration
	seq   int64     // its score in the queue; 0 until it has one
	until time.Time // a lock handed to it now would be valid until then, by our accounting
	taken bool      // it holds the lock now
}

// hold is one tenure of the lock, from a first acquisition to its end.
type hold struct {
	id      string
	token   int64         // fencing token; 0 without WithFencing
	lease   time.Duration // fixed for the hold's life
	parent  context.Context
	done    chan struct{}       // closed when the hold ends
	unbind  func() bool         // stops the context.AfterFunc on parent
	rl      *RedisLock          // whose hold it is
	renewal *renew.Lease[*hold] // its deadlines and renewals, in its Locker's scheduler

	// Guarded by RedisLock.mu.
	state       holdState
	err         error           // why it ended; nil while live and after a release
	count       int             // acquisitions not yet released
	selfRelease chan struct{}   // while its key is released at its maximum hold; closed when done
	keyLeft     bool            // released without deleting the key: left to expire
	life        context.Context // made on demand (Do): ends with the hold
	endLife     context.CancelCauseFunc
}

// holdState is where a hold is in its life.
type holdState int

const (
	// renewing: the hold is live, and the watchdog (if any) renews it.
	renewing holdState = iota
	// expiring: the holding context ended; the hold is still live, nothing
	// renews it any more, and it ends when its lease runs out (or at its
	// Release, loss or maximum hold, whichever comes first).
	expiring
	// ended: Done is closed; err says why (nil after a release).
	ended
)

func (h *hold) live() bool { return h.state != ended }

// A Locker makes the locks of one Redis client and owns what they share:
// one set of defaults, a key namespace (WithPrefix), the renewal scheduler,
// the wake-up subscriptions, the clock, and their lifetime: Close ends every
// hold still held and returns once nothing of its locks runs. Make it with
// NewLocker; the zero value is not usable. A Locker is safe for concurrent
// use. The locks of NewRedisLock share their store's default Locker, which
// lives as long as they do and is never closed.
type Locker struct {
	store    *store.Store
	opts     []Option
	clock    clock.Clock
	renewals *renew.Scheduler[*hold] // its holds' renewals, lease deadlines and maximum holds
	wake     *wake.Set               // its locks' wake-ups: one subscription per client
	log      *slog.Logger            // WithLogger's given to NewLocker, or logx's for go-zero's store; nil: slog.Default() at each line
	life     lifetime
}

// lifetime is a Locker's life: what Close ends and waits for.
type lifetime struct {
	shared   bool               // a store's default Locker: never closed
	closing  context.Context    // ends when Close begins
	shut     context.CancelFunc // ends closing
	finished chan struct{}      // closed when Close returns
	wg       sync.WaitGroup     // give-backs, self-releases, and its locks' waits

	mu     sync.Mutex
	joined bool    // Close has waited for its goroutines: start no more
	late   []error // releases that failed after Close began
}

// enter counts one more goroutine that Close waits for, and reports false,
// counting nothing, once Close has waited.
func (l *Locker) enter() bool {
	l.life.mu.Lock()
	defer l.life.mu.Unlock()
	if l.life.joined {
		return false
	}
	l.life.wg.Add(1)
	return true
}

// isClosed reports whether Close was called.
func (l *Locker) isClosed() bool { return l.life.closing.Err() != nil }
