package redislock

import "time"

// clock is the time source of the watchdog, the lease accounting and the
// maximum hold. Tests swap in a fake one to control time without sleeping.
type clock interface {
	Now() time.Time
	// NewTimer returns a timer that sends on C() after d.
	NewTimer(d time.Duration) timer
	// WatchFunc calls f in its own goroutine after d: the timer of a
	// renewal scheduler.
	WatchFunc(d time.Duration, f func()) timer
}

type timer interface {
	C() <-chan time.Time // nil for a WatchFunc timer
	Reset(d time.Duration)
	Stop()
}

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }
func (realClock) WatchFunc(d time.Duration, f func()) timer {
	return realTimer{time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }
