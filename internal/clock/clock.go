// Package clock is the time source of leases, renewals and waits: the real
// one, or a test's, which moves only when the test says.
package clock

import "time"

// A Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that sends on C() after d.
	NewTimer(d time.Duration) Timer
	// WatchFunc calls f in its own goroutine after d, and again after each
	// Reset: the timer of a renewal scheduler.
	WatchFunc(d time.Duration, f func()) Timer
}

// A Timer is a time.Timer of a Clock.
type Timer interface {
	C() <-chan time.Time // nil for a WatchFunc timer
	Reset(d time.Duration)
	Stop()
}

// Real is the clock of package time.
type Real struct{}

func (Real) Now() time.Time                 { return time.Now() }
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }
func (Real) WatchFunc(d time.Duration, f func()) Timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }

// Backoff is the wait before try n+1 after n failures in a row of
// something done every interval: interval/8, doubling, at most
// interval/2, and at least 1ms.
func Backoff(interval time.Duration, failures int) time.Duration {
	d := interval / 8
	for i := 1; i < failures && d < interval/2; i++ {
		d *= 2
	}
	return max(min(d, interval/2), time.Millisecond)
}

// Later returns the later of a and b.
func Later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
