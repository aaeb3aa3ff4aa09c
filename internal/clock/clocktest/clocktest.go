// Package clocktest is a Clock for tests: it moves only when told.
package clocktest

import (
	"github.com/redislock/redislock/internal/clock"
	"sort"
	"sync"
	"testing"
	"time"
)

// Clock is a clock that moves only with Advance. Channel timers fire by
// a send on their buffered channel, WatchFunc timers by a call
// in a goroutine of their own, as with package time.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*timer]struct{}
	arms   int // watchdog timers armed so far (WatchFunc and Reset)
	busy   int // WatchFunc calls under way
}

type timer struct {
	c      *Clock
	at     time.Time
	active bool
	ch     chan time.Time
	fn     func()
	watch  bool // made by WatchFunc
}

func New() *Clock {
	return &Clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), timers: map[*timer]struct{}{}}
}

func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *Clock) NewTimer(d time.Duration) clock.Timer {
	t := &timer{c: c, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (c *Clock) WatchFunc(d time.Duration, f func()) clock.Timer {
	t := &timer{c: c, fn: f, watch: true}
	t.Reset(d)
	return t
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Reset(d time.Duration) {
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

func (t *timer) Stop() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.active = false
	delete(t.c.timers, t)
}

func (t *timer) fire(now time.Time) {
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
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*timer
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

// Busy returns how many WatchFunc calls are under way.
func (c *Clock) Busy() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busy
}

// Arms returns how many times a watchdog timer has been armed.
func (c *Clock) Arms() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.arms
}

// nextDutyLocked returns when the watchdog has its next duty: the earliest
// watchdog timer; zero if none is armed.
func (c *Clock) nextDutyLocked() time.Time {
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
func (c *Clock) Step(t testing.TB) {
	t.Helper()
	if c.StepOr(t, nil) {
		t.Fatal("clocktest: Step ended without the watchdog arming its timer")
	}
}

// StepOr is Step that also returns, reporting true, when done closes: the
// hold ended and the watchdog will arm no timer again. It waits at most
// 10 s of real time in all.
func (c *Clock) StepOr(t testing.TB, done <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	wait := func(what string) {
		if time.Now().After(deadline) {
			t.Fatalf("clocktest: %s within 10s", what)
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

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
