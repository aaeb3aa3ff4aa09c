package clock

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	for _, tc := range []struct {
		interval time.Duration
		failures int
		want     time.Duration
	}{
		{800 * time.Millisecond, 1, 100 * time.Millisecond},
		{800 * time.Millisecond, 2, 200 * time.Millisecond},
		{800 * time.Millisecond, 3, 400 * time.Millisecond},
		{800 * time.Millisecond, 30, 400 * time.Millisecond}, // at most interval/2
		{4 * time.Millisecond, 1, time.Millisecond},          // at least 1ms
		{0, 5, time.Millisecond},
	} {
		if got := Backoff(tc.interval, tc.failures); got != tc.want {
			t.Errorf("Backoff(%v, %d) = %v; want %v", tc.interval, tc.failures, got, tc.want)
		}
	}
}

func TestLater(t *testing.T) {
	a, b := time.Unix(1, 0), time.Unix(2, 0)
	if Later(a, b) != b || Later(b, a) != b || Later(a, a) != a {
		t.Error("Later did not return the later time")
	}
}

func TestRealTimers(t *testing.T) {
	var c Clock = Real{}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	fired := make(chan struct{})
	w := c.WatchFunc(time.Millisecond, func() { close(fired) })
	<-fired
	w.Stop()
	if w.C() != nil {
		t.Error("a WatchFunc timer has a channel")
	}
}
