package redislock

import (
	"github.com/redislock/redislock/internal/clock"
	"sort"
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only with Advance. Channel timers fire by
// a send on their buffered channel, WatchFunc timers by a call
// in a goroutine of their own, as with package time.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*fakeTimer]struct{}
	arms   int // watchdog timers armed so far (WatchFunc and Reset)
	busy   int // WatchFunc calls under way
}

type fakeTimer struct {
	c      *fakeClock
	at     time.Time
	active bool
	ch     chan time.Time
	fn     func()
	watch  bool // made by WatchFunc
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), timers: map[*fakeTimer]struct{}{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) clock.Timer {
	t := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (c *fakeClock) WatchFunc(d time.Duration, f func()) clock.Timer {
	t := &fakeTimer{c: c, fn: f, watch: true}
	t.Reset(d)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Reset(d time.Duration) {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.watch {
		c.arms++
	}
	if d <= 0 {
		delete(c.timers, t)
		t.active = false
		now := c.now
		c.mu.Unlock()
		t.fire(now)
		c.mu.Lock()
		return
	}
	t.at, t.active = c.now.Add(d), true
	c.timers[t] = struct{}{}
}

func (t *fakeTimer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.active = false
	delete(t.c.timers, t)
}

func (t *fakeTimer) fire(now time.Time) {
	if t.ch == nil {
		c := t.c
		c.mu.Lock()
		c.busy++
		c.mu.Unlock()
		go func() {
			defer func() {
				c.mu.Lock()
				c.busy--
				c.mu.Unlock()
			}()
			t.fn()
		}()
		return
	}
	select {
	case t.ch <- now:
	default:
	}
}

// Advance moves the clock forward by d and fires the timers that are due,
// in order of their deadlines.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
			t.active = false
			delete(c.timers, t)
		}
	}
	now := c.now
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		t.fire(now)
	}
}

// Arms returns how many times a watchdog timer has been armed.
func (c *fakeClock) Arms() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.arms
}

// nextDutyLocked returns when the watchdog has its next duty: the earliest
// watchdog timer; zero if none is armed.
func (c *fakeClock) nextDutyLocked() time.Time {
	var next time.Time
	for tm := range c.timers {
		if tm.watch && (next.IsZero() || tm.at.Before(next)) {
			next = tm.at
		}
	}
	return next
}

// Step advances the clock to the watchdog's next duty and waits until the
// watchdog has dealt with it (its run and the run's batch are over) and
// armed its timer again.
func (c *fakeClock) Step(t testing.TB) {
	t.Helper()
	if c.StepOr(t, nil) {
		t.Fatal("fake clock: Step ended without the watchdog arming its timer")
	}
}

// StepOr is Step that also returns, reporting true, when done closes: the
// hold ended and the watchdog will arm no timer again. It waits at most
// 10 s of real time in all.
func (c *fakeClock) StepOr(t testing.TB, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	wait := func(what string) {
		if time.Now().After(deadline) {
			t.Fatalf("fake clock: %s within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
	armed := 0
	for {
		if done != nil && isClosed(done) {
			return true
		}
		c.mu.Lock()
		next, now := c.nextDutyLocked(), c.now
		armed = c.arms
		c.mu.Unlock()
		if !next.IsZero() {
			c.Advance(next.Sub(now))
			break
		}
		wait("no timer armed")
	}
	for {
		if done != nil && isClosed(done) {
			return true
		}
		c.mu.Lock()
		acted := c.arms > armed && c.busy == 0
		c.mu.Unlock()
		if acted {
			return false
		}
		wait("the watchdog did not act")
	}
}
