package redislock

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// A RetryStrategy paces the attempts of AcquireWait when no wake-up arrives:
// without a pub/sub client, while the subscription is down, or when the
// holder's lease has no expiry. However long it says, the next attempt comes
// no later than the end of the holder's lease (a millisecond past the PTTL
// the last attempt read). Every failed attempt counts,
// those made when the holder's lease would end included (behind a holder
// that renews, one comes every lease), except a fair waiter's attempts made
// only to stay live in its queue.
type RetryStrategy interface {
	// Backoff returns how long to wait after n failed attempts (n >= 1),
	// and false to give up. It may be called more than once with the same
	// n (a fair waiter's refreshes ask again).
	Backoff(n int) (time.Duration, bool)
}

// DefaultRetry is the strategy of a RedisLock made without WithRetry:
// exponential backoff with full jitter from 2ms up to 100ms.
var DefaultRetry = ExponentialRetry(2*time.Millisecond, 100*time.Millisecond)

// FixedRetry waits interval between attempts, for ever.
func FixedRetry(interval time.Duration) RetryStrategy {
	if interval <= 0 {
		return badRetry{fmt.Errorf("%w: FixedRetry(%v) must be positive", ErrInvalidExpiry, interval)}
	}
	return fixedRetry(interval)
}

type fixedRetry time.Duration

func (f fixedRetry) Backoff(int) (time.Duration, bool) { return time.Duration(f), true }

// ExponentialRetry waits a random time between min and min*2^(n-1) after n
// failed attempts, the upper end capped at max: exponential backoff with
// full jitter.
func ExponentialRetry(min, max time.Duration) RetryStrategy {
	if min <= 0 || max < min {
		return badRetry{fmt.Errorf("%w: ExponentialRetry(%v, %v) needs 0 < min <= max", ErrInvalidExpiry, min, max)}
	}
	return expRetry{min: min, max: max}
}

type expRetry struct{ min, max time.Duration }

func (e expRetry) Backoff(n int) (time.Duration, bool) {
	upper := e.min
	for i := 1; i < n && upper < e.max; i++ {
		if upper > e.max/2 {
			upper = e.max
			break
		}
		upper *= 2
	}
	upper = min(upper, e.max)
	return e.min + rand.N(upper-e.min+1), true
}

// LimitRetry gives up after attempts failed attempts, however each was
// woken (see RetryStrategy), pacing them with s. It bounds attempts, not
// time: to bound a wait's time, use WithWaitTimeout or a context.
func LimitRetry(s RetryStrategy, attempts int) RetryStrategy {
	switch {
	case s == nil:
		return badRetry{fmt.Errorf("%w: LimitRetry of a nil strategy", ErrInvalidExpiry)}
	case attempts < 1:
		return badRetry{fmt.Errorf("%w: LimitRetry(%d attempts) needs at least 1", ErrInvalidExpiry, attempts)}
	}
	return limitRetry{s: s, attempts: attempts}
}

type limitRetry struct {
	s        RetryStrategy
	attempts int
}

func (l limitRetry) Backoff(n int) (time.Duration, bool) {
	if n >= l.attempts {
		return 0, false
	}
	return l.s.Backoff(n)
}

func (l limitRetry) err() error { return retryErr(l.s) }

// badRetry is what a constructor returns for bad arguments; WithRetry
// reports its error from AcquireWait.
type badRetry struct{ e error }

func (b badRetry) Backoff(int) (time.Duration, bool) { return 0, false }
func (b badRetry) err() error                        { return b.e }

// retryErr returns the construction error carried by s, if any.
func retryErr(s RetryStrategy) error {
	if v, ok := s.(interface{ err() error }); ok {
		return v.err()
	}
	return nil
}
