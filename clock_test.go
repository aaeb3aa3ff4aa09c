package redislock

import "github.com/redislock/redislock/internal/clock/clocktest"

// fakeClock is a clock that moves only with Advance (see clocktest).
type fakeClock = clocktest.Clock

func newFakeClock() *fakeClock { return clocktest.New() }
