package redislock

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"
)

const (
	// DefaultExpiry is the lease of a RedisLock made without WithExpiry or
	// SetExpire. With the watchdog it is renewed every DefaultExpiry/3, so it
	// is also how long a crashed holder keeps others out.
	DefaultExpiry = 10 * time.Second
	// MinExpiry and MaxExpiry bound the lease.
	MinExpiry = 10 * time.Millisecond
	MaxExpiry = 24 * time.Hour
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 64 << 10
)

// An Option configures a RedisLock in NewRedisLock.
type Option func(*options)

type options struct {
	expiry   time.Duration
	maxHold  time.Duration
	watchdog bool
	fencing  bool
	fair     bool
	permits  int  // of a semaphore (WithPermits); 0 for others
	shared   bool // WithShared
	replicas int  // that acknowledge each write of a hold (WithReplicas); 0: none wait
	clock    clock.Clock
	logger   *slog.Logger    // WithLogger; nil: the Locker's
	tracer   trace.Tracer    // WithTracerProvider's; nil: the global provider's
	invalid  []invalidOption // options given an invalid value last

	waitTimeout time.Duration
	prefix      string

	retry     RetryStrategy
	pubsub    Subscriber
	pubsubSet bool // WithPubSub was given, maybe with nil
}

// An invalidOption is an option whose latest value was invalid, and why.
type invalidOption struct {
	name string
	err  error
}

// judge records whether the value just given to the option name is
// invalid, and reports whether it is valid: of each option, the last value
// given counts, so that a lock's own overrides its Locker's.
func (o *options) judge(name string, invalid bool, why func() error) bool {
	o.invalid = slices.DeleteFunc(o.invalid, func(i invalidOption) bool { return i.name == name })
	if invalid {
		o.invalid = append(o.invalid, invalidOption{name, why()})
	}
	return !invalid
}

// err returns why the options are invalid, if they are.
func (o *options) err() error {
	if len(o.invalid) > 0 {
		return o.invalid[0].err
	}
	return nil
}

// WithExpiry sets the lease: how long the key lives without renewal. The
// watchdog renews it every expiry/3. It must lie in [MinExpiry, MaxExpiry];
// an invalid value is reported as ErrInvalidExpiry by Acquire.
// SetExpire overrides it.
func WithExpiry(expiry time.Duration) Option {
	return func(o *options) { o.expiry = expiry }
}

// WithMaxHold bounds a hold: once maxHold has passed since the first
// acquisition, the watchdog stops renewing, the hold ends with
// ErrMaxHoldExceeded, and the lock is released. By default a hold has no
// bound.
func WithMaxHold(maxHold time.Duration) Option {
	return func(o *options) {
		if o.judge("WithMaxHold", maxHold <= 0, func() error {
			return fmt.Errorf("%w: WithMaxHold(%v) must be positive", ErrInvalidExpiry, maxHold)
		}) {
			o.maxHold = maxHold
		}
	}
}

// WithoutWatchdog turns lease renewal off, as in go-zero's RedisLock: the key
// expires one lease after the last acquisition or re-entry, and the hold
// then ends with ErrLockLost.
func WithoutWatchdog() Option {
	return func(o *options) { o.watchdog = false }
}

// WithFencing makes every first acquisition mint a fencing token,
// atomically with taking the lock: a per-key counter that each new holder
// advances to the larger of its last value plus one and the server's clock
// in microseconds, so tokens strictly increase across holders, also after
// a failover that lost the last increments as long as the servers' clocks
// agree. Re-entries and renewals keep the token; Token returns it. The
// counter is a key beside the lock's, in its Redis Cluster slot, that never
// expires (see docs/fencing.md).
func WithFencing() Option {
	return func(o *options) { o.fencing = true }
}

// WithWaitTimeout bounds how long AcquireWait and Do wait for a busy lock:
// their first attempt is always made, and an attempt under way is never cut
// short, but once d has passed they make no more and give up with an error
// matching ErrNotAcquired and context.DeadlineExceeded. Unlike a deadline
// on their context, it bounds only the wait, never the renewal of the hold
// they acquire. By default they wait as long as their context allows.
func WithWaitTimeout(d time.Duration) Option {
	return func(o *options) {
		if o.judge("WithWaitTimeout", d <= 0, func() error {
			return fmt.Errorf("%w: WithWaitTimeout(%v) must be positive", ErrInvalidExpiry, d)
		}) {
			o.waitTimeout = d
		}
	}
}

// WithPrefix puts the lock's key in a namespace: its Redis key is prefix
// followed by the key given (Key returns it whole). Given to NewLocker, it
// namespaces every lock of that Locker, so that a "billing:" Locker and a
// "shipping:" Locker never collide on "invoice:1". The last WithPrefix
// given wins; a lock's own overrides its Locker's.
func WithPrefix(prefix string) Option {
	return func(o *options) { o.prefix = prefix }
}

// WithReplicas makes every write that takes, renews or hands over a hold
// wait until n replicas of the key's primary have it (WAIT, in the same
// round trip), so that a failover to one of them keeps the hold. An
// acquisition is reported only once they acknowledged it: one they did not
// acknowledge within a tenth of the lease (at most a second) is given back
// and fails with ErrNotReplicated, and so does one with fewer than n
// replicas online, at once and writing nothing; AcquireWait and Do then
// attempt again, except in that last case. A renewal they did not
// acknowledge is a failed renewal, and the lease still ends the hold on
// time. Releases do not wait. n = 0 turns it off; a negative n is reported
// as ErrInvalidReplicas, and a store that cannot send WAIT after a script
// on the key's primary (a go-zero store of a Cluster, a Scripter of one's
// own) as ErrNotReplicated and errors.ErrUnsupported, by the first call.
// See docs/reliability.md.
func WithReplicas(n int) Option {
	return func(o *options) {
		if o.judge("WithReplicas", n < 0, func() error {
			return fmt.Errorf("%w: WithReplicas(%d) must not be negative", ErrInvalidReplicas, n)
		}) {
			o.replicas = n
		}
	}
}

// replicasTimeout is how long WAIT waits for the replicas of a write with
// a lease of lease: a tenth of it, at most a second (go-redis's and
// go-zero's clients read a pipeline's replies within 3 s, WAIT's too).
func replicasTimeout(lease time.Duration) time.Duration {
	return min(lease/10, time.Second)
}

// validExpiry checks a lease.
func validExpiry(d time.Duration) error {
	switch {
	case d <= 0:
		return fmt.Errorf("%w: %v is not positive", ErrInvalidExpiry, d)
	case d < MinExpiry:
		return fmt.Errorf("%w: %v is shorter than %v", ErrInvalidExpiry, d, MinExpiry)
	case d > MaxExpiry:
		return fmt.Errorf("%w: %v is longer than %v", ErrInvalidExpiry, d, MaxExpiry)
	}
	return nil
}

const (
	millisPerSecond = 1000
	// tolerance is what go-zero adds to SetExpire's seconds, in ms.
	tolerance = 500
	// selfReleaseTimeout bounds a release that no caller's context bounds:
	// at the maximum hold, of an abandoned attempt, and Do's.
	selfReleaseTimeout = 2 * time.Second
)

// WithRetry sets how AcquireWait paces its attempts when no wake-up arrives
// (DefaultRetry if not set; nil leaves it as it was). An invalid strategy from FixedRetry,
// ExponentialRetry or LimitRetry is reported as ErrInvalidExpiry by
// AcquireWait.
func WithRetry(s RetryStrategy) Option {
	return func(o *options) {
		if s != nil {
			o.retry = s
		}
	}
}

// WithPubSub sets the client whose pub/sub wakes AcquireWait when the lock is
// released. A RedisLock made with FromGoRedis uses that client by default;
// give one for go-zero's store, which exposes no pub/sub. WithPubSub(nil)
// turns wake-ups off: AcquireWait then paces its attempts by its
// RetryStrategy alone.
func WithPubSub(s Subscriber) Option {
	return func(o *options) {
		o.pubsub, o.pubsubSet = s, true
		if store.IsNil(s) {
			o.pubsub = nil
		}
	}
}
