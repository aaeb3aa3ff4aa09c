package redislock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redislock/redislock/internal/renew"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"
)

func TestExclusionBetweenLocks(t *testing.T) {
	mr, c := newMini(t)
	a := NewRedisLock(FromGoRedis(c), "job")
	b := NewRedisLock(FromGoRedis(c), "job")

	mustAcquire(t, a)
	if got, _ := mr.Get("job"); got != holderID(a) {
		t.Fatalf("GET job = %q, want the owner id %q", got, holderID(a))
	}
	if ok, err := b.Acquire(); ok || err != nil {
		t.Fatalf("second lock: Acquire = %v, %v; want false, nil", ok, err)
	}
	if ok, err := b.Release(); ok || err != nil {
		t.Fatalf("second lock: Release without a hold = %v, %v; want false, nil", ok, err)
	}
	if !mr.Exists("job") {
		t.Fatal("a Release by a non-holder deleted the key")
	}
	mustRelease(t, a)
	mustAcquire(t, b)
	if ok, err := a.Acquire(); ok || err != nil {
		t.Fatalf("first lock after handover: Acquire = %v, %v; want false, nil", ok, err)
	}
	mustRelease(t, b)
}

func TestReentrancyCountsHolds(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "nested")
	other := NewRedisLock(FromGoRedis(c), "nested")

	for i := 1; i <= 3; i++ {
		mustAcquire(t, rl)
		if rl.Holds() != i {
			t.Fatalf("after %d acquisitions Holds = %d", i, rl.Holds())
		}
	}
	done := rl.Done()
	for i := 2; i >= 1; i-- {
		mustRelease(t, rl)
		if rl.Holds() != i {
			t.Fatalf("Holds = %d, want %d", rl.Holds(), i)
		}
		if !mr.Exists("nested") {
			t.Fatalf("key deleted with %d holds left", i)
		}
		if ok, _ := other.Acquire(); ok {
			t.Fatal("another lock acquired while holds remain")
		}
		if isClosed(done) {
			t.Fatal("Done closed while holds remain")
		}
	}
	mustRelease(t, rl)
	if mr.Exists("nested") {
		t.Fatal("key kept after the last release")
	}
	if !isClosed(done) || !isClosed(rl.Done()) || rl.Err() != nil || rl.Holds() != 0 {
		t.Fatalf("after the last release: Done closed %v, Err %v, Holds %d", isClosed(done), rl.Err(), rl.Holds())
	}
	if ok, err := rl.Release(); ok || err != nil {
		t.Fatalf("one Release too many = %v, %v; want false, nil", ok, err)
	}
}

func TestReentryRefreshesLease(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k", WithExpiry(2*time.Second), WithoutWatchdog())
	mustAcquire(t, rl)
	mr.FastForward(1500 * time.Millisecond)
	mustAcquire(t, rl)
	if ttl := mr.TTL("k"); ttl != 2*time.Second {
		t.Fatalf("TTL after re-entry = %v, want the full lease 2s", ttl)
	}
	mustRelease(t, rl)
	mustRelease(t, rl)
}

func TestGoZeroInterop(t *testing.T) {
	mr, _ := newMini(t)
	store := goZeroStore(t, mr.Addr())
	theirs := zredis.NewRedisLock(store, "shared")
	theirs.SetExpire(5)
	ours := NewRedisLock(store, "shared") // go-zero's store, as it is

	// go-zero first: ours is refused, without error.
	if ok, err := theirs.Acquire(); !ok || err != nil {
		t.Fatalf("go-zero Acquire = %v, %v", ok, err)
	}
	if ok, err := ours.Acquire(); ok || err != nil {
		t.Fatalf("ours while go-zero holds: %v, %v; want false, nil", ok, err)
	}
	if ok, err := ours.Release(); ok || err != nil || !mr.Exists("shared") {
		t.Fatalf("ours released go-zero's lock: %v, %v", ok, err)
	}
	if ok, err := theirs.Release(); !ok || err != nil {
		t.Fatalf("go-zero Release = %v, %v", ok, err)
	}

	// Ours first: go-zero is refused, and cannot delete it either.
	mustAcquire(t, ours)
	if v, _ := mr.Get("shared"); v != holderID(ours) {
		t.Fatalf("value %q is not our plain id %q", v, holderID(ours))
	}
	if ok, err := theirs.Acquire(); ok || err != nil {
		t.Fatalf("go-zero while we hold: %v, %v; want false, nil", ok, err)
	}
	if ok, err := theirs.Release(); ok || err != nil || !mr.Exists("shared") {
		t.Fatalf("go-zero released our lock: %v, %v", ok, err)
	}
	mustRelease(t, ours)
	if ok, err := theirs.Acquire(); !ok || err != nil {
		t.Fatalf("go-zero after our release: %v, %v", ok, err)
	}
	if ttl := mr.TTL("shared"); ttl != 5500*time.Millisecond {
		t.Fatalf("go-zero's TTL = %v", ttl)
	}
}

func TestSetExpireKeepsGoZeroArithmetic(t *testing.T) {
	mr, c := newMini(t)
	for _, tc := range []struct {
		seconds int
		want    time.Duration
	}{{0, 500 * time.Millisecond}, {1, 1500 * time.Millisecond}, {30, 30500 * time.Millisecond}} {
		rl := NewRedisLock(FromGoRedis(c), "exp", WithoutWatchdog())
		rl.SetExpire(tc.seconds)
		mustAcquire(t, rl)
		if got := mr.TTL("exp"); got != tc.want {
			t.Errorf("SetExpire(%d): TTL %v, want %v", tc.seconds, got, tc.want)
		}
		mustRelease(t, rl)
	}
	rl := NewRedisLock(FromGoRedis(c), "exp")
	mustAcquire(t, rl)
	if got := mr.TTL("exp"); got != DefaultExpiry {
		t.Errorf("default TTL %v, want %v", got, DefaultExpiry)
	}
	mustRelease(t, rl)
}

func TestWatchdogRenewsAcrossFastForward(t *testing.T) {
	w := newWatched(t, "long")
	mr, clk, s, rl := w.mr, w.clk, w.spy, w.rl

	for i := 0; i < 10; i++ { // 10 s of Redis time under a 3 s lease
		clk.Step(t)
		mr.FastForward(time.Second)
	}
	if got := s.count(extendScript); got != 10 {
		t.Fatalf("renewals = %d, want 10 (one per lease/3)", got)
	}
	if v, _ := mr.Get("long"); v != holderID(rl) {
		t.Fatalf("after 10s the key holds %q, want our id", v)
	}
	if ttl := mr.TTL("long"); ttl != 2*time.Second { // renewed to 3s, then 1s passed
		t.Fatalf("TTL %v: the last renewal did not refresh the lease", ttl)
	}
	if isClosed(rl.Done()) || rl.Err() != nil {
		t.Fatalf("hold ended: %v", rl.Err())
	}
	mustRelease(t, rl)

	// The same without the watchdog: the key expires and the hold ends.
	plain := NewRedisLock(s, "short", WithExpiry(3*time.Second), WithoutWatchdog(), withClock(clk))
	mustAcquire(t, plain)
	mr.FastForward(3 * time.Second)
	if mr.Exists("short") {
		t.Fatal("miniredis kept a key past its TTL")
	}
	clk.Advance(3 * time.Second)
	waitDone(t, plain.Done(), "lease ran out without watchdog")
	if !errors.Is(plain.Err(), ErrLockLost) {
		t.Fatalf("Err = %v, want ErrLockLost", plain.Err())
	}
	if got := s.count(extendScript); got != 10 {
		t.Fatalf("a lock without watchdog renewed: %d extends", got-10)
	}
}

func TestLossIsReportedAndNeverRetaken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(*miniredis.Miniredis)
		want   string // the key's value after the loss
	}{
		{"deleted", func(mr *miniredis.Miniredis) { mr.Del("k") }, ""},
		{"foreign owner", func(mr *miniredis.Miniredis) { _ = mr.Set("k", "someone-else") }, "someone-else"},
		{"not a string", func(mr *miniredis.Miniredis) { mr.Del("k"); mr.HSet("k", "f", "v") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWatched(t, "k")
			mr, clk, rl := w.mr, w.clk, w.rl
			mustAcquire(t, rl) // two holds owed
			done := rl.Done()

			tc.break_(mr)
			clk.Advance(time.Second) // the next renewal finds out
			waitDone(t, done, "loss")
			if !errors.Is(rl.Err(), ErrLockLost) || rl.Holds() != 0 {
				t.Fatalf("Err %v, Holds %d; want ErrLockLost, 0", rl.Err(), rl.Holds())
			}
			// The owed acquisitions must be released before the lock can be
			// taken again: a re-entry after the loss fails, and takes nothing.
			if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrLockLost) {
				t.Fatalf("Acquire after loss = %v, %v; want false, ErrLockLost", ok, err)
			}
			if v, _ := mr.Get("k"); v != tc.want || (tc.name == "not a string" && !mr.Exists("k")) {
				t.Fatalf("key = %q after loss, want %q (untouched)", v, tc.want)
			}
			for i := 0; i < 2; i++ {
				if ok, err := rl.Release(); ok || !errors.Is(err, ErrLockLost) {
					t.Fatalf("Release %d after loss = %v, %v; want false, ErrLockLost", i, ok, err)
				}
			}
			if v, _ := mr.Get("k"); v != tc.want {
				t.Fatalf("a release after loss changed the key to %q", v)
			}
			if ok, err := rl.Release(); ok || err != nil {
				t.Fatalf("Release with nothing owed = %v, %v; want false, nil", ok, err)
			}
			mr.Del("k")
			mustAcquire(t, rl) // a fresh hold, once everything was given back
			if rl.Err() != nil || isClosed(rl.Done()) {
				t.Fatalf("fresh hold: Err %v", rl.Err())
			}
			mustRelease(t, rl)
		})
	}
}

func TestReentryDetectsLoss(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k")
	mustAcquire(t, rl)
	mr.Del("k")
	if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrLockLost) {
		t.Fatalf("re-entry on a deleted key = %v, %v; want false, ErrLockLost", ok, err)
	}
	if !isClosed(rl.Done()) || mr.Exists("k") {
		t.Fatalf("Done closed %v, key exists %v; want true, false", isClosed(rl.Done()), mr.Exists("k"))
	}
	if ok, err := rl.Release(); ok || !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release = %v, %v", ok, err)
	}
}

func TestMaxHold(t *testing.T) {
	w := newWatched(t, "k", WithMaxHold(5*time.Second))
	mr, clk, rl := w.mr, w.clk, w.rl
	for i := 0; i < 4; i++ { // renewals at 1s..4s keep it
		clk.Step(t)
		mr.FastForward(time.Second)
	}
	if isClosed(rl.Done()) || !mr.Exists("k") {
		t.Fatal("hold ended before the maximum hold")
	}
	clk.Advance(time.Second) // 5s
	waitDone(t, rl.Done(), "max hold")
	if !errors.Is(rl.Err(), ErrMaxHoldExceeded) {
		t.Fatalf("Err = %v, want ErrMaxHoldExceeded", rl.Err())
	}
	if ok, err := rl.Release(); ok || !errors.Is(err, ErrMaxHoldExceeded) {
		t.Fatalf("Release = %v, %v; want false, ErrMaxHoldExceeded", ok, err)
	}
	if mr.Exists("k") { // Release waited for the watchdog's release
		t.Fatal("key kept after the maximum hold")
	}
	mustAcquire(t, rl) // the next hold has its own maximum
	mustRelease(t, rl)
}

// The holding context bounds the renewal, not the lock (issue 8): when it
// ends, renewal stops, the hold lasts out its lease, and then Done closes
// with the context's cause; the key is left to expire, as go-zero's would.
func TestHoldingContextStopsRenewalNotLock(t *testing.T) {
	mr, c := newMini(t)
	clk := newFakeClock()
	s := newSpy(FromGoRedis(c))
	ctx, cancel := context.WithCancelCause(context.Background())
	rl := NewRedisLock(s, "k", WithExpiry(3*time.Second), withClock(clk))
	if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
		t.Fatalf("AcquireCtx = %v, %v", ok, err)
	}
	mustAcquire(t, rl) // a re-entry with another context does not rebind
	until := rl.Until()
	h := rl.cur
	cause := errors.New("request finished")
	cancel(cause)
	waitState(t, rl, h, expiring)
	extends := s.count(extendScript)
	clk.Advance(time.Second) // a renewal would be due
	clk.Advance(time.Second)
	if n := s.count(extendScript); n != extends {
		t.Fatalf("%d renewals after the holding context ended", n-extends)
	}
	if isClosed(rl.Done()) || rl.Holds() != 2 || !rl.Until().Equal(until) || rl.Err() != nil {
		t.Fatalf("before the lease ran out: Done closed %v, Holds %d, Until moved %v, Err %v",
			isClosed(rl.Done()), rl.Holds(), !rl.Until().Equal(until), rl.Err())
	}
	clk.Advance(time.Second) // past the lease, by our own accounting
	waitDone(t, rl.Done(), "lease ran out after the holding context ended")
	if !errors.Is(rl.Err(), cause) || errors.Is(rl.Err(), ErrLockLost) || !rl.Until().IsZero() {
		t.Fatalf("Err = %v, Until %v; want the cause (not a loss) and zero", rl.Err(), rl.Until())
	}
	if !mr.Exists("k") {
		t.Fatal("the key was deleted: it must last out its lease on Redis too")
	}
	for i := 0; i < 2; i++ {
		if ok, err := rl.Release(); ok || !errors.Is(err, cause) {
			t.Fatalf("Release = %v, %v; want false, the cause", ok, err)
		}
	}
	if v, _ := mr.Get("k"); v != h.id {
		t.Fatal("the releases of an ended hold touched the key")
	}
	mr.FastForward(3 * time.Second) // Redis expires it in its own time
	mustAcquire(t, rl)
	mustRelease(t, rl)
}

// A Release after the holding context ended, before the lease ran out,
// deletes the key as usual.
func TestReleaseAfterHoldingContextEnded(t *testing.T) {
	mr, c := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	rl := NewRedisLock(FromGoRedis(c), "k")
	if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
		t.Fatalf("AcquireCtx = %v, %v", ok, err)
	}
	h := rl.cur
	cancel()
	waitState(t, rl, h, expiring)
	if isClosed(rl.Done()) {
		t.Fatal("Done closed when the holding context ended")
	}
	mustRelease(t, rl)
	if mr.Exists("k") || rl.Err() != nil {
		t.Fatalf("after Release: key exists %v, Err %v", mr.Exists("k"), rl.Err())
	}
}

// TestHoldingContextEndsDuringRenewal: the holding context ends while the
// watchdog is in a renewal that then gets through. No renewal follows; the
// hold lasts out the lease that renewal gave it, then ends with the cause.
func TestHoldingContextEndsDuringRenewal(t *testing.T) {
	mr, c := newMini(t)
	clk := newFakeClock()
	store := newStuckRenewal(c)
	ctx, cancel := context.WithCancelCause(context.Background())
	rl := NewRedisLock(store, "k", WithExpiry(3*time.Second), withClock(clk))
	if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
		t.Fatalf("AcquireCtx = %v, %v", ok, err)
	}
	h := rl.cur
	clk.Advance(time.Second) // the first renewal is due
	sent := clk.Now()
	waitDone(t, store.entered, "the renewal started")
	cause := errors.New("shutting down")
	cancel(cause)
	waitState(t, rl, h, expiring)
	close(store.unblock)
	for watchRunning(rl, h) {
		time.Sleep(time.Millisecond)
	}
	renewed := sent.Add(3*time.Second - renew.Margin(3*time.Second))
	if !rl.Until().Equal(renewed) {
		t.Fatalf("Until %v after the renewal got through; want the lease it gave, to %v", rl.Until(), renewed)
	}
	clk.Advance(renewed.Sub(clk.Now()) - time.Millisecond) // to just before the lease the renewal gave runs out
	if isClosed(rl.Done()) {
		t.Fatal("Done closed before the lease the renewal gave ran out")
	}
	clk.Advance(time.Millisecond)
	waitDone(t, rl.Done(), "lease ran out")
	if !errors.Is(rl.Err(), cause) {
		t.Fatalf("Err = %v, want the cause", rl.Err())
	}
	if ok, err := rl.Release(); ok || !errors.Is(err, cause) {
		t.Fatalf("Release = %v, %v; want false, the cause", ok, err)
	}
	if !mr.Exists("k") {
		t.Fatal("the key was deleted; it lasts out its lease")
	}
	if n := store.renewals.Load(); n != 1 {
		t.Fatalf("%d renewals, want the one under way only", n)
	}
}

func TestHoldingContextWithoutWatchdog(t *testing.T) {
	mr, c := newMini(t)
	clk := newFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	rl := NewRedisLock(FromGoRedis(c), "k", WithoutWatchdog(), WithExpiry(time.Second), withClock(clk))
	if ok, err := rl.AcquireCtx(ctx); !ok || err != nil {
		t.Fatalf("AcquireCtx = %v, %v", ok, err)
	}
	h := rl.cur
	cancel()
	waitState(t, rl, h, expiring)
	if isClosed(rl.Done()) {
		t.Fatal("Done closed before the lease ran out")
	}
	clk.Advance(time.Second)
	waitDone(t, rl.Done(), "lease ran out")
	if ok, err := rl.Release(); ok || !errors.Is(err, context.Canceled) || !mr.Exists("k") {
		t.Fatalf("Release = %v, %v; key exists %v", ok, err, mr.Exists("k"))
	}
}

// waitState waits until h reaches state.
func waitState(t *testing.T, rl *RedisLock, h *hold, state holdState) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rl.mu.Lock()
		got := h.state
		rl.mu.Unlock()
		if got == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hold in state %d, want %d", got, state)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAcquireWithEndedContext(t *testing.T) {
	mr, c := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rl := NewRedisLock(FromGoRedis(c), "k")
	if ok, err := rl.AcquireCtx(ctx); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireCtx(cancelled) = %v, %v; want false, context.Canceled", ok, err)
	}
	if mr.Exists("k") || rl.Holds() != 0 {
		t.Fatal("a cancelled acquisition left a hold behind")
	}
}

// netErr is a transient network failure.
var netErr error = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}

func TestTransientRenewalFailuresAreRetried(t *testing.T) {
	w := newWatched(t, "k")
	mr, clk, s, rl := w.mr, w.clk, w.spy, w.rl

	var failed atomic.Int64
	s.setFail(func(script *redis.Script) error {
		if script == extendScript && failed.Load() < 3 {
			failed.Add(1)
			return netErr
		}
		return nil
	})
	for failed.Load() < 3 || s.count(extendScript) < 4 {
		clk.Step(t)
	}
	if isClosed(rl.Done()) {
		t.Fatalf("hold ended after transient failures: %v", rl.Err())
	}
	// The server answering LOADING is transient too.
	mr.SetError("LOADING Redis is loading the dataset in memory")
	before := s.count(extendScript)
	for s.count(extendScript) < before+2 {
		clk.Step(t)
	}
	mr.SetError("")
	clk.Step(t)
	if isClosed(rl.Done()) || rl.Err() != nil {
		t.Fatalf("hold ended: %v", rl.Err())
	}
	mustRelease(t, rl)
}

func TestRenewalFailingUntilDeadlineIsLoss(t *testing.T) {
	w := newWatched(t, "k")
	mr, clk, s, rl := w.mr, w.clk, w.spy, w.rl
	s.setFail(func(script *redis.Script) error { return netErr })

	// Step from renewal attempt to renewal attempt until the hold ends; it
	// must not end before the validity deadline of the acquisition.
	deadline := clk.Now().Add(3*time.Second - renew.Margin(3*time.Second))
	for {
		now, lost := clk.Now(), isClosed(rl.Done())
		if lost && now.Before(deadline) {
			t.Fatalf("loss declared at %v, before the deadline %v", now, deadline)
		}
		if lost {
			break
		}
		if now.After(deadline.Add(time.Second)) {
			t.Fatalf("still held at %v, past the deadline %v", now, deadline)
		}
		clk.StepOr(t, rl.Done())
	}
	err := rl.Err()
	var ne net.Error
	if !errors.Is(err, ErrLockLost) || !errors.As(err, &ne) {
		t.Fatalf("Err = %v; want ErrLockLost wrapping the network error", err)
	}
	if n := s.count(extendScript); n < 5 { // at 1s, then +lease/24, /12, /6, /6...
		t.Fatalf("renewal tried %d times, want the retries", n)
	}
	if v, _ := mr.Get("k"); v != holderID(rl) {
		t.Fatal("the key was touched while Redis was unreachable")
	}
}

// TestNoGoroutineBetweenRenewals: the watchdog runs on timers; between its
// runs a held lock has no goroutine of its own.
func TestNoGoroutineBetweenRenewals(t *testing.T) {
	w := newWatched(t, "k")
	for i := 0; i < 3; i++ {
		w.clk.Step(t) // a renewal, and the timer armed for the next
		deadline := time.Now().Add(5 * time.Second)
		for n := watchdogGoroutines(); n > 0; n = watchdogGoroutines() {
			if time.Now().After(deadline) {
				t.Fatalf("after renewal %d, %d goroutines still in the watchdog", i+1, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	if n := w.spy.count(extendScript); n != 3 {
		t.Fatalf("%d renewals, want 3", n)
	}
	mustRelease(t, w.rl)
}

// watchdogGoroutines counts the goroutines with the watchdog on their stack.
func watchdogGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "renew.(*Scheduler[...]).run(")
}

func TestNothingRenewsAfterRelease(t *testing.T) {
	w := newWatched(t, "k")
	clk, s, rl := w.clk, w.spy, w.rl
	clk.Step(t) // the watchdog runs
	h := rl.cur
	mustRelease(t, rl)
	if watchRunning(rl, h) {
		t.Fatal("Release returned while the watchdog still ran")
	}
	calls := s.total.Load()
	for i := 0; i < 10; i++ {
		clk.Advance(time.Second)
	}
	time.Sleep(20 * time.Millisecond)
	if got := s.total.Load(); got != calls {
		t.Fatalf("%d script calls after Release returned", got-calls)
	}
}

func TestReleaseWhenRedisUnreachable(t *testing.T) {
	w := newWatched(t, "k")
	mr, clk, s, rl := w.mr, w.clk, w.spy, w.rl
	s.setFail(func(*redis.Script) error { return netErr })
	ok, err := rl.Release()
	if ok || !errors.Is(err, netErr) {
		t.Fatalf("Release = %v, %v; want false and the network error", ok, err)
	}
	if !isClosed(rl.Done()) || rl.Holds() != 0 {
		t.Fatal("hold not over after a failed final release")
	}
	calls := s.total.Load()
	clk.Advance(5 * time.Second)
	time.Sleep(20 * time.Millisecond)
	if s.total.Load() != calls {
		t.Fatal("renewals went on after a failed release")
	}
	if v, _ := mr.Get("k"); v != holderID(rl) {
		t.Fatal("the key should be left to expire with its lease")
	}
}

func TestTTL(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k", WithExpiry(4*time.Second))
	if _, err := rl.TTL(context.Background()); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("TTL before acquiring: %v, want ErrNotHeld", err)
	}
	mustAcquire(t, rl)
	mr.FastForward(time.Second)
	if d, err := rl.TTL(context.Background()); err != nil || d != 3*time.Second {
		t.Fatalf("TTL = %v, %v; want 3s", d, err)
	}
	mr.Del("k")
	_, err := rl.TTL(context.Background())
	if !errors.Is(err, ErrNotHeld) || !errors.Is(err, ErrLockLost) {
		t.Fatalf("TTL of a deleted key: %v; want ErrNotHeld and ErrLockLost", err)
	}
	if !isClosed(rl.Done()) {
		t.Fatal("TTL found the lock lost but the hold goes on")
	}
	// Until its acquisition is released, every TTL says why the hold ended,
	// as Acquire and Release do (round 9: later calls said ErrNotHeld alone).
	if _, err := rl.TTL(context.Background()); !errors.Is(err, ErrNotHeld) || !errors.Is(err, ErrLockLost) {
		t.Fatalf("TTL after the loss: %v; want ErrNotHeld and ErrLockLost", err)
	}
	if ok, err := rl.Release(); ok || !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release = %v, %v; want ErrLockLost", ok, err)
	}
	if _, err := rl.TTL(context.Background()); !errors.Is(err, ErrNotHeld) || errors.Is(err, ErrLockLost) {
		t.Fatalf("TTL once released: %v; want ErrNotHeld alone", err)
	}
}

func TestConcurrentUseOfOneLock(t *testing.T) {
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "shared-by-goroutines")
	other := NewRedisLock(FromGoRedis(c), "shared-by-goroutines")
	var wg sync.WaitGroup
	var otherGot atomic.Int64
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				ok, err := rl.Acquire()
				for err == nil && !ok { // the rival holds it between our holds
					runtime.Gosched()
					ok, err = rl.Acquire()
				}
				if err != nil {
					errs <- fmt.Errorf("Acquire: %v", err)
					return
				}
				_ = rl.Holds()
				_ = rl.Done()
				if ok, err := rl.Release(); err != nil || !ok {
					errs <- fmt.Errorf("Release = %v, %v", ok, err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // a rival taking turns whenever the shared hold is over
		defer wg.Done()
		for i := 0; i < 200; i++ {
			if ok, _ := other.Acquire(); ok {
				otherGot.Add(1)
				other.Release()
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if rl.Holds() != 0 || mr.Exists("shared-by-goroutines") {
		t.Fatalf("Holds %d, key exists %v after all releases", rl.Holds(), mr.Exists("shared-by-goroutines"))
	}
	t.Logf("the rival lock got it %d times", otherGot.Load())
}

func TestBadInput(t *testing.T) {
	mr, c := newMini(t)
	store := FromGoRedis(c)
	var nilClient *redis.Client
	var nilZero *zredis.Redis
	longKey := strings.Repeat("k", MaxKeyLen+1)
	for _, tc := range []struct {
		name string
		lock func() *RedisLock
		ctx  context.Context
		want error
	}{
		{"nil store", func() *RedisLock { return NewRedisLock(nil, "k") }, nil, ErrNilStore},
		{"nil go-redis client", func() *RedisLock { return NewRedisLock(FromGoRedis(nilClient), "k") }, nil, ErrNilStore},
		{"typed nil go-zero store", func() *RedisLock { return NewRedisLock(nilZero, "k") }, nil, ErrNilStore},
		{"zero value", func() *RedisLock { return &RedisLock{} }, nil, ErrNilStore},
		{"empty key", func() *RedisLock { return NewRedisLock(store, "") }, nil, ErrEmptyKey},
		{"key too long", func() *RedisLock { return NewRedisLock(store, longKey) }, nil, ErrKeyTooLong},
		{"zero expiry", func() *RedisLock { return NewRedisLock(store, "k", WithExpiry(0)) }, nil, ErrInvalidExpiry},
		{"negative expiry", func() *RedisLock { return NewRedisLock(store, "k", WithExpiry(-time.Second)) }, nil, ErrInvalidExpiry},
		{"sub-minimum expiry", func() *RedisLock { return NewRedisLock(store, "k", WithExpiry(time.Millisecond)) }, nil, ErrInvalidExpiry},
		{"absurd expiry", func() *RedisLock { return NewRedisLock(store, "k", WithExpiry(1000*time.Hour)) }, nil, ErrInvalidExpiry},
		{"negative SetExpire", func() *RedisLock {
			rl := NewRedisLock(store, "k")
			rl.SetExpire(-1)
			return rl
		}, nil, ErrInvalidExpiry},
		{"most negative SetExpire", func() *RedisLock {
			rl := NewRedisLock(store, "k")
			rl.SetExpire(math.MinInt)
			return rl
		}, nil, ErrInvalidExpiry},
		{"absurd SetExpire", func() *RedisLock {
			rl := NewRedisLock(store, "k")
			rl.SetExpire(1 << 62)
			return rl
		}, nil, ErrInvalidExpiry},
		{"zero max hold", func() *RedisLock { return NewRedisLock(store, "k", WithMaxHold(0)) }, nil, ErrInvalidExpiry},
		{"negative max hold", func() *RedisLock { return NewRedisLock(store, "k", WithMaxHold(-time.Minute)) }, nil, ErrInvalidExpiry},
		{"nil context", func() *RedisLock { return NewRedisLock(store, "k") }, nilCtx(), ErrNilContext},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := mr.CommandCount()
			rl := tc.lock()
			ctx := tc.ctx
			if ctx == nil && tc.want != ErrNilContext {
				ctx = context.Background()
			}
			if ok, err := rl.AcquireCtx(ctx); ok || !errors.Is(err, tc.want) {
				t.Errorf("AcquireCtx = %v, %v; want false, %v", ok, err, tc.want)
			}
			if tc.want != ErrInvalidExpiry { // the lease is only needed to acquire
				if ok, err := rl.ReleaseCtx(ctx); ok || !errors.Is(err, tc.want) {
					t.Errorf("ReleaseCtx = %v, %v; want false, %v", ok, err, tc.want)
				}
				if _, err := rl.TTL(ctx); !errors.Is(err, tc.want) {
					t.Errorf("TTL: %v; want %v", err, tc.want)
				}
			}
			if rl.Holds() != 0 || rl.Err() != nil || !isClosed(rl.Done()) {
				t.Error("a failed call left state behind")
			}
			if got := mr.CommandCount() - before; got != 0 {
				t.Errorf("%d commands sent to Redis for invalid input", got)
			}
		})
	}
}

// nilCtx hides a nil context from vet.
func nilCtx() context.Context { return nil }

func TestOddKeys(t *testing.T) {
	mr, c := newMini(t)
	for _, key := range []string{"{tag}rest", "a{b}c{d}", "}{", "\x00\xff\r\n bin", "ключ", strings.Repeat("x", MaxKeyLen)} {
		rl := NewRedisLock(FromGoRedis(c), key)
		other := NewRedisLock(FromGoRedis(c), key)
		mustAcquire(t, rl)
		if v, _ := mr.Get(key); v != holderID(rl) {
			t.Errorf("key %q: value %q, want our id", key, v)
		}
		if ok, err := other.Acquire(); ok || err != nil {
			t.Errorf("key %q: a second lock got %v, %v", key, ok, err)
		}
		mustRelease(t, rl)
		if mr.Exists(key) {
			t.Errorf("key %q kept after release", key)
		}
	}
	// Only the records of releases remain, each expiring within a lease.
	for _, k := range mr.Keys() {
		if !strings.HasSuffix(k, "redislock:releases") || mr.TTL(k) <= 0 || mr.TTL(k) > DefaultExpiry {
			t.Errorf("left %q behind, TTL %v", k, mr.TTL(k))
		}
	}
}

var errServer = errors.New("ERR something broke")

func TestGarbageReplies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store replyStore
		want  error
	}{
		{"nil reply", replyStore{}, ErrUnexpectedReply},
		{"redis.Nil", replyStore{err: redis.Nil}, ErrUnexpectedReply},
		{"wrong string", replyStore{reply: "QUEUED"}, ErrUnexpectedReply},
		{"array", replyStore{reply: []any{int64(1)}}, ErrUnexpectedReply},
		{"float", replyStore{reply: 1.5}, ErrUnexpectedReply},
		{"server error", replyStore{err: errServer}, errServer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rl := NewRedisLock(tc.store, "k")
			ok, err := rl.Acquire()
			if ok || !errors.Is(err, tc.want) || errors.Is(err, redis.Nil) {
				t.Fatalf("Acquire = %v, %v; want false, %v", ok, err, tc.want)
			}
			if rl.Holds() != 0 {
				t.Fatal("garbage taken for an acquisition")
			}
		})
	}
	// A hold whose renewal, TTL and release get garbage.
	w := newWatched(t, "k")
	s, rl := w.spy, w.rl
	s.setReply("garbage") // no script replies a bulk string there
	if _, err := rl.TTL(context.Background()); !errors.Is(err, ErrUnexpectedReply) {
		t.Fatalf("TTL with garbage = %v", err)
	}
	if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrUnexpectedReply) {
		t.Fatalf("re-entry with garbage = %v, %v", ok, err)
	}
	if ok, err := rl.Release(); ok || !errors.Is(err, ErrUnexpectedReply) {
		t.Fatalf("Release with garbage = %v, %v", ok, err)
	}
}

// After the lease ran out while a renewal was stuck in the network, Release
// does not wait for that renewal, and the renewal, reaching Redis after
// Release returned, extends nothing: Release deleted the key first.
func TestReleaseAfterLossDoesNotWaitForStuckRenewal(t *testing.T) {
	w := newWatched(t, "k")
	mr, clk, s, rl := w.mr, w.clk, w.spy, w.rl
	unblock := make(chan struct{})
	s.setFail(func(script *redis.Script) error {
		if script == extendScript {
			<-unblock // a renewal stuck in the network; then it gets through
		}
		return nil
	})
	clk.Advance(time.Second) // the first renewal starts, and sticks
	for s.count(extendScript) == 0 {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(2 * time.Second) // past the validity deadline
	waitDone(t, rl.Done(), "lease ran out during a stuck renewal")
	if !errors.Is(rl.Err(), ErrLockLost) {
		t.Fatalf("Err = %v", rl.Err())
	}
	h := rl.cur
	if _, err := rl.Release(); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release: %v, want ErrLockLost", err)
	}
	if !watchRunning(rl, h) {
		t.Fatal("the renewal is not stuck any more: the test proves nothing")
	}
	if mr.Exists("k") {
		t.Fatal("Release left the key to a renewal still in flight")
	}
	close(unblock)
	for watchRunning(rl, h) {
		time.Sleep(time.Millisecond)
	}
	if mr.Exists("k") {
		t.Fatal("the stuck renewal extended the key after Release returned")
	}
}

// The black-box review of round 5 found SetExpire(-5) reported as "-1ns is
// not positive": the error now shows the seconds given.
func TestNegativeSetExpireSaysWhatWasGiven(t *testing.T) {
	_, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k")
	rl.SetExpire(-5)
	if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrInvalidExpiry) || !strings.Contains(err.Error(), "-5s") {
		t.Fatalf("Acquire after SetExpire(-5) = %v, %v; want ErrInvalidExpiry saying -5s", ok, err)
	}
}
