package redislock

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"
	"go.uber.org/goleak"

	"github.com/redislock/redislock/internal/redisserver"
)

// These tests run against a real redis-server that they start on a free
// loopback port. They sleep in real time where the scenario is about real
// time, but assert outcomes and order, never durations.

func TestRealWatchdogKeepsShortLease(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	rl := NewRedisLock(FromGoRedis(c), "short-lease", WithExpiry(300*time.Millisecond))
	mustAcquire(t, rl)
	id := holderID(rl)

	// 3 s of real time under a 300 ms lease: check the key every 50 ms.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		v, err := admin.Get(context.Background(), "short-lease").Result()
		if err != nil || v != id {
			t.Fatalf("key = %q, %v; want our id while the watchdog runs", v, err)
		}
		if isClosed(rl.Done()) {
			t.Fatalf("hold ended: %v", rl.Err())
		}
	}
	mustRelease(t, rl)
	if n := admin.Exists(context.Background(), "short-lease").Val(); n != 0 {
		t.Fatal("key kept after Release")
	}
}

func TestRealClientKillDoesNotLoseLock(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	rl := NewRedisLock(FromGoRedis(c), "killed", WithExpiry(time.Second))
	mustAcquire(t, rl)
	ctx := context.Background()
	killed := int64(0)
	for i := 0; i < 5; i++ {
		n, err := admin.ClientKillByFilter(ctx, "TYPE", "normal", "SKIPME", "yes").Result()
		if err != nil {
			t.Fatal(err)
		}
		killed += n
		time.Sleep(400 * time.Millisecond) // more than a renewal interval
	}
	if killed == 0 {
		t.Fatal("CLIENT KILL found no connection to kill")
	}
	requireHeldThenRelease(t, rl, admin)
}

// requireHeldThenRelease checks that rl's hold goes on and the key holds
// its id, as seen from another client, and releases it.
func requireHeldThenRelease(t *testing.T, rl *RedisLock, admin *redis.Client) {
	t.Helper()
	if isClosed(rl.Done()) {
		t.Fatalf("hold ended: %v", rl.Err())
	}
	if v := admin.Get(context.Background(), rl.Key()).Val(); v != holderID(rl) {
		t.Fatalf("key = %q, want our id %q", v, holderID(rl))
	}
	mustRelease(t, rl)
	if admin.Exists(context.Background(), rl.Key()).Val() != 0 {
		t.Fatal("key kept after Release")
	}
}

func TestRealDebugSleepShorterThanLease(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	s := newSpy(FromGoRedis(c))
	rl := NewRedisLock(s, "sleepy", WithExpiry(time.Second))
	mustAcquire(t, rl)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		before := s.count(extendScript)
		if err := admin.Do(ctx, "DEBUG", "SLEEP", "0.5").Err(); err != nil {
			t.Fatalf("DEBUG SLEEP: %v", err)
		}
		for s.count(extendScript) < before+2 { // the renewals go on after it
			if isClosed(rl.Done()) {
				t.Fatalf("hold ended by a 0.5s server pause under a 1s lease: %v", rl.Err())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	requireHeldThenRelease(t, rl, admin)
}

func TestRealKeyDeletedClosesDoneAtNextRenewal(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	var afterDelete atomic.Int64
	var deleted atomic.Bool
	s := newSpy(FromGoRedis(c))
	s.setFail(func(script *redis.Script) error {
		if script == extendScript && deleted.Load() {
			afterDelete.Add(1)
		}
		return nil
	})
	rl := NewRedisLock(s, "deleted", WithExpiry(300*time.Millisecond))
	mustAcquire(t, rl)
	for s.count(extendScript) < 2 { // the watchdog is under way
		time.Sleep(10 * time.Millisecond)
	}
	if err := admin.Del(context.Background(), "deleted").Err(); err != nil {
		t.Fatal(err)
	}
	deleted.Store(true)
	start := time.Now()
	waitDone(t, rl.Done(), "key deleted from outside")
	elapsed := time.Since(start)
	if !errors.Is(rl.Err(), ErrLockLost) {
		t.Fatalf("Err = %v, want ErrLockLost", rl.Err())
	}
	// Within one renewal interval: the first renewal sent after the delete
	// found it (the count is of renewals sent after the delete; it is 0 when
	// a renewal sent just before the flag was set reached Redis after the
	// delete and found it).
	if n := afterDelete.Load(); n > 1 {
		t.Fatalf("%d renewals after the delete before Done closed, want at most 1", n)
	}
	t.Logf("Done closed %v after the delete (renewal interval 100ms)", elapsed)
	if ok, err := rl.Release(); ok || !errors.Is(err, ErrLockLost) {
		t.Fatalf("Release = %v, %v", ok, err)
	}
}

func TestRealContentionNeverOverlaps(t *testing.T) {
	srv := redisserver.Start(t)
	goRedis := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 32})
	t.Cleanup(func() { _ = goRedis.Close() })
	goZero := goZeroStore(t, srv.Addr)
	// go-zero's circuit breaker counts the NOSCRIPT replies of the first
	// EVALSHAs as failures, and a burst of them can make it drop the EVAL
	// fallbacks (see Limits in the README). This test is about exclusion, so
	// the scripts are loaded ahead.
	for _, script := range []*redis.Script{acquireScript, releaseScript} {
		if err := script.Load(context.Background(), goRedis).Err(); err != nil {
			t.Fatal(err)
		}
	}

	const workers, total = 16, 2000
	var (
		taken, overlaps, inside atomic.Int64
		wg                      sync.WaitGroup
		errs                    = make(chan error, workers)
	)
	for w := 0; w < workers; w++ {
		var store Scripter = FromGoRedis(goRedis)
		if w%2 == 1 {
			store = goZero // half the workers through go-zero's store
		}
		rl := NewRedisLock(store, "contended", WithExpiry(2*time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for taken.Load() < total {
				ok, err := rl.Acquire()
				if err != nil {
					errs <- err
					return
				}
				if !ok {
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
					continue
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				taken.Add(1)
				inside.Add(-1)
				if ok, err := rl.Release(); !ok || err != nil {
					errs <- errors.Join(errors.New("release failed"), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping holds", overlaps.Load())
	}
	if taken.Load() < total {
		t.Fatalf("%d acquisitions, want %d", taken.Load(), total)
	}
	t.Logf("%d acquisitions by %d workers, 0 overlaps", taken.Load(), workers)
}

func TestRealGoZeroInterop(t *testing.T) {
	srv := redisserver.Start(t)
	store := goZeroStore(t, srv.Addr)
	theirs := zredis.NewRedisLock(store, "interop")
	theirs.SetExpire(2)
	ours := NewRedisLock(FromGoRedis(srv.Client(t)), "interop")
	for round := 0; round < 3; round++ {
		mustAcquire(t, ours)
		if ok, err := theirs.Acquire(); ok || err != nil {
			t.Fatalf("go-zero while we hold: %v, %v", ok, err)
		}
		mustRelease(t, ours)
		if ok, err := theirs.Acquire(); !ok || err != nil {
			t.Fatalf("go-zero after release: %v, %v", ok, err)
		}
		if ok, err := ours.Acquire(); ok || err != nil {
			t.Fatalf("ours while go-zero holds: %v, %v", ok, err)
		}
		if ok, err := theirs.Release(); !ok || err != nil {
			t.Fatalf("go-zero release: %v, %v", ok, err)
		}
	}
}

// stalledAcquire makes an acquisition of a lock of newLock while admin's
// server sleeps 0.6 s (DEBUG SLEEP), and calls then as soon as it has
// failed, its reply lost to the stall; the sleep is over when it returns.
// It fails t when 3 tries in a row were answered.
func stalledAcquire(t *testing.T, admin *redis.Client, newLock func() *RedisLock, then func()) {
	t.Helper()
	ctx := context.Background()
	for try := 1; try <= 3; try++ {
		rl := newLock()
		mustAcquire(t, rl) // the scripts are loaded
		mustRelease(t, rl)
		slept := make(chan error, 1)
		go func() { slept <- admin.Do(ctx, "DEBUG", "SLEEP", "0.6").Err() }()
		time.Sleep(50 * time.Millisecond) // DEBUG SLEEP is under way
		ok, err := rl.AcquireCtx(ctx)
		if !ok && err != nil {
			then()
		}
		if serr := <-slept; serr != nil {
			t.Fatalf("DEBUG SLEEP: %v", serr)
		}
		if !ok && err != nil {
			return
		}
		mustRelease(t, rl)
	}
	t.Fatal("the acquisition was answered in 3 tries: the server did not stall")
}

// TestRealStalledAcquisitionLeavesNoOrphan: an acquisition that times out on
// a stalled server, whose give-back times out too, leaves no orphan: the
// give-back is tried again, with backoff, until it is answered. (Issue 17,
// defect 3: it was tried once, and the key held the abandoned attempt's id
// for the rest of its lease.)
func TestRealStalledAcquisitionLeavesNoOrphan(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 150 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	rl := NewRedisLock(FromGoRedis(c), "stalled", WithExpiry(5*time.Second))
	stalledAcquire(t, admin, func() *RedisLock { return rl }, func() {})
	waitGiveBacks(rl)
	if v, err := admin.Get(context.Background(), "stalled").Result(); err != redis.Nil {
		t.Fatalf("the key holds %q (%v) after the give-back", v, err)
	}
	mustAcquire(t, rl)
	mustRelease(t, rl)
}

// TestRealCloseDuringAStalledGiveBack: a Locker closed while the give-back
// of a stalled acquisition is being retried tries it again within Close's
// two seconds, and returns once it is done: the key is free. (Black-box
// review of issue 17: Close dropped the give-back and returned nil, and the
// key held the abandoned attempt's id for the rest of its lease.)
func TestRealCloseDuringAStalledGiveBack(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 150 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	var l *Locker
	newLock := func() *RedisLock {
		l = NewLocker(FromGoRedis(c))
		return l.NewLock("stalled-close", WithExpiry(5*time.Second))
	}
	var closed error
	stalledAcquire(t, admin, newLock, func() { closed = l.Close() })
	if closed != nil {
		t.Fatalf("Close = %v; the give-back had two seconds for a 0.6 s stall", closed)
	}
	if v, err := admin.Get(context.Background(), "stalled-close").Result(); err != redis.Nil {
		t.Fatalf("the key holds %q (%v) after Close returned", v, err)
	}
}

// TestClosedClientLeavesNothingRunning: an acquisition through a closed
// client was never sent, so there is nothing to give back: no give-back is
// left retrying in the background. (A closed client's error counted as
// ambiguous, and its give-back retried for a lease after the CLI closed
// its client.)
func TestClosedClientLeavesNothingRunning(t *testing.T) {
	_, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "closed-client")
	mustAcquire(t, rl)
	mustRelease(t, rl)
	before := goleak.IgnoreCurrent()
	_ = c.Close()
	if ok, err := rl.Acquire(); ok || !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Acquire through a closed client = %v, %v", ok, err)
	}
	if err := goleak.Find(before); err != nil {
		t.Fatalf("after an acquisition never sent: %v", err)
	}
}
