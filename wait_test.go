package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

func TestRetryStrategies(t *testing.T) {
	if d, ok := FixedRetry(7 * time.Millisecond).Backoff(1000); !ok || d != 7*time.Millisecond {
		t.Fatalf("FixedRetry = %v, %v", d, ok)
	}
	e := ExponentialRetry(2*time.Millisecond, 50*time.Millisecond)
	seen := map[time.Duration]bool{}
	for n := 1; n <= 70; n++ {
		upper := 50 * time.Millisecond
		if n <= 5 {
			upper = 2 * time.Millisecond << (n - 1)
		}
		for i := 0; i < 20; i++ {
			d, ok := e.Backoff(n)
			if !ok || d < 2*time.Millisecond || d > upper {
				t.Fatalf("ExponentialRetry.Backoff(%d) = %v, %v; want in [2ms, %v]", n, d, ok, upper)
			}
			seen[d] = true
		}
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct waits: no jitter", len(seen))
	}
	if d, ok := ExponentialRetry(time.Hour, 100*365*24*time.Hour).Backoff(1 << 30); !ok || d < time.Hour {
		t.Fatalf("huge attempt count: %v, %v", d, ok)
	}
	l := LimitRetry(FixedRetry(time.Millisecond), 3)
	for n, want := range []bool{true, true, false, false} {
		if _, ok := l.Backoff(n + 1); ok != want {
			t.Fatalf("LimitRetry(3).Backoff(%d) ok = %v", n+1, ok)
		}
	}
	for _, bad := range []RetryStrategy{
		FixedRetry(0), FixedRetry(-time.Second), ExponentialRetry(0, time.Second),
		ExponentialRetry(time.Second, time.Millisecond), LimitRetry(nil, 3), LimitRetry(FixedRetry(time.Millisecond), 0),
		LimitRetry(FixedRetry(-1), 3),
	} {
		_, c := newMini(t)
		rl := NewRedisLock(FromGoRedis(c), "k", WithRetry(bad))
		if err := rl.AcquireWait(context.Background()); !errors.Is(err, ErrInvalidExpiry) {
			t.Errorf("AcquireWait with %#v: %v, want ErrInvalidExpiry", bad, err)
		}
	}
}

func TestAcquireWaitGivesUpWithItsContext(t *testing.T) {
	for _, pubsub := range []bool{true, false} {
		mr, c := newMini(t)
		holder := NewRedisLock(FromGoRedis(c), "k")
		mustAcquire(t, holder)
		var opts []Option
		if !pubsub {
			opts = append(opts, WithPubSub(nil))
		}
		rl := NewRedisLock(FromGoRedis(c), "k", opts...)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := rl.AcquireWait(ctx)
		cancel()
		if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("pubsub %v: AcquireWait = %v; want ErrNotAcquired and DeadlineExceeded", pubsub, err)
		}
		if rl.Holds() != 0 || mr.Exists("k") && holderID(holder) != mustGet(mr, "k") {
			t.Fatal("a failed wait changed the lock")
		}
		requireNoHubs(t)
		mustRelease(t, holder)
	}
}

func TestAcquireWaitRetryLimit(t *testing.T) {
	_, c := newMini(t)
	s := newSpy(FromGoRedis(c))
	holder := NewRedisLock(FromGoRedis(c), "k")
	mustAcquire(t, holder)
	rl := NewRedisLock(s, "k", WithPubSub(nil), WithRetry(LimitRetry(FixedRetry(time.Millisecond), 3)))
	err := rl.AcquireWait(context.Background())
	if !errors.Is(err, ErrNotAcquired) || errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireWait = %v; want ErrNotAcquired alone", err)
	}
	if n := s.count(acquireScript); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
	mustRelease(t, holder)
}

func TestAcquireWaitWakesOnRelease(t *testing.T) {
	_, c := newMini(t)
	s := newSpy(FromGoRedis(c))
	holder := NewRedisLock(FromGoRedis(c), "k", WithExpiry(time.Minute))
	mustAcquire(t, holder)
	rl := NewRedisLock(s, "k", WithPubSub(c), WithRetry(FixedRetry(time.Hour)))
	wakeByRelease(t, holder, rl, s)
	if n := s.count(acquireScript); n != 3 {
		t.Fatalf("%d attempts, want 3: one before subscribing, one once subscribed, one after the wake-up", n)
	}
	mustRelease(t, rl)
	requireNoHubs(t)
}

func TestAcquireWaitWithBrokenPubSub(t *testing.T) {
	// The pub/sub client cannot connect: waiting falls back to retries.
	_, c := newMini(t)
	port, err := redisserver.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dead := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })
	holder := NewRedisLock(FromGoRedis(c), "k", WithExpiry(time.Minute))
	mustAcquire(t, holder)
	s := newSpy(FromGoRedis(c))
	rl := NewRedisLock(s, "k", WithPubSub(dead), WithRetry(FixedRetry(5*time.Millisecond)))
	got := make(chan error, 1)
	go func() { got <- rl.AcquireWait(context.Background()) }()
	for s.count(acquireScript) < 3 { // retrying at its own pace
		time.Sleep(time.Millisecond)
	}
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, rl)
	requireNoHubs(t)
}

func TestAcquireWaitReentersAtOnce(t *testing.T) {
	_, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k")
	mustAcquire(t, rl)
	if err := rl.AcquireWait(context.Background()); err != nil || rl.Holds() != 2 {
		t.Fatalf("AcquireWait on a held lock: %v, Holds %d", err, rl.Holds())
	}
	mustRelease(t, rl)
	mustRelease(t, rl)
}

func TestAcquireWaitGoZeroStoreUsesRetries(t *testing.T) {
	mr, _ := newMini(t)
	t.Run("miniredis", func(t *testing.T) { waitThroughGoZero(t, mr.Addr()) })
	t.Run("redis-server", func(t *testing.T) { waitThroughGoZero(t, redisserver.Start(t).Addr) })
}

// waitThroughGoZero waits on go-zero's store, which has no pub/sub: the
// retry strategy paces the attempts.
func waitThroughGoZero(t *testing.T, addr string) {
	store := goZeroStore(t, addr)
	holder := NewRedisLock(store, "k", WithExpiry(time.Minute))
	mustAcquire(t, holder)
	s := newSpy(store)
	rl := NewRedisLock(s, "k", WithRetry(FixedRetry(5*time.Millisecond)))
	if rl.opts.pubsub != nil {
		t.Fatal("go-zero's store should give no pub/sub")
	}
	got := make(chan error, 1)
	go func() { got <- rl.AcquireWait(context.Background()) }()
	for s.count(acquireScript) < 3 { // retrying at its pace
		time.Sleep(time.Millisecond)
	}
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, rl)
}

func TestAcquireWaitSharedRedisLock(t *testing.T) {
	// Two goroutines wait on one RedisLock: they share the hold it gets.
	_, c := newMini(t)
	holder := NewRedisLock(FromGoRedis(c), "k")
	mustAcquire(t, holder)
	rl := NewRedisLock(FromGoRedis(c), "k")
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- rl.AcquireWait(context.Background())
		}()
	}
	for queueLen(rl) < 2 {
		time.Sleep(time.Millisecond)
	}
	mustRelease(t, holder)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if rl.Holds() != 2 {
		t.Fatalf("Holds = %d, want 2", rl.Holds())
	}
	mustRelease(t, rl)
	mustRelease(t, rl)
}

// TestAcquireWaitReentersPastAnotherLocksWaiter: a wait of a RedisLock,
// queued behind a waiter of another RedisLock of the process, re-enters at
// once when the RedisLock takes the lock, by an earlier wait of its own
// (first in line) or by Acquire. It must not wait behind the other lock's
// waiter, which waits for this very hold (round 8 of the black-box review:
// it waited until the hold was released, a deadlock if the holder waits
// for it).
func TestAcquireWaitReentersPastAnotherLocksWaiter(t *testing.T) {
	for _, by := range []string{"AcquireWait", "Acquire"} {
		t.Run(by, func(t *testing.T) {
			mr, c := newMini(t)
			holder := NewRedisLock(FromGoRedis(c), "k")
			mustAcquire(t, holder)
			rl := NewRedisLock(FromGoRedis(c), "k")
			other := NewRedisLock(FromGoRedis(c), "k")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			first, second, third := make(chan error, 1), make(chan error, 1), make(chan error, 1)
			start := func(rl *RedisLock, done chan<- error) {
				n := queueLen(rl)
				go func() { done <- rl.AcquireWait(ctx) }()
				waitFor(t, 10*time.Second, "the waiter queued", func() bool { return queueLen(rl) == n+1 })
			}
			if by == "AcquireWait" {
				start(rl, first)
			}
			start(other, second)
			start(rl, third)
			if by == "AcquireWait" {
				mustRelease(t, holder)
				if err := <-first; err != nil {
					t.Fatal(err)
				}
			} else {
				mr.Del("k") // no release is published: nobody is woken
				mustAcquire(t, rl)
			}
			select {
			case err := <-third:
				if err != nil || rl.Holds() != 2 {
					t.Fatalf("the second AcquireWait of rl = %v with Holds %d, want a re-entry (2)", err, rl.Holds())
				}
			case err := <-second:
				t.Fatalf("the other lock's AcquireWait = %v while rl held the lock", err)
			case <-time.After(5 * time.Second):
				t.Fatal("the second AcquireWait of rl is still waiting behind the other lock's waiter while rl holds the lock")
			}
			mustRelease(t, rl)
			mustRelease(t, rl)
			if err := <-second; err != nil {
				t.Fatal(err)
			}
			mustRelease(t, other)
			holder.Release()
		})
	}
}

// TestAcquireWaitReentersAtOnceWithoutPubSub: without wake-ups, a wait of
// a RedisLock whose other wait takes the lock re-enters it at once, not at
// its next paced attempt (round 9: 30 ms at p50 with DefaultRetry, and a
// short hold could be missed entirely).
func TestAcquireWaitReentersAtOnceWithoutPubSub(t *testing.T) {
	_, c := newMini(t)
	holder := NewRedisLock(FromGoRedis(c), "k", WithExpiry(time.Hour)) // no attempt at its lease's end
	mustAcquire(t, holder)
	defer releaseAll(holder) // also when the test fails: no hold left to the tests after it
	s := newSpy(FromGoRedis(c))
	rl := NewRedisLock(s, "k", WithPubSub(nil), WithRetry(FixedRetry(time.Hour)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waits := make(chan error, 2)
	for range 2 {
		go func() { waits <- rl.AcquireWait(ctx) }()
	}
	// Both are in line, the first after its attempt (the second attempts
	// too if it comes before the first joined), and sleep for an hour: a
	// release wakes neither, but the attempt of a third call takes the
	// lock. (Waiting for two attempts flaked on a loaded machine: a second
	// wait that comes after the first joined queues without one.)
	waitFor(t, 10*time.Second, "both waits in line", func() bool {
		return s.ended.Load() >= 1 && queueLen(rl) == 2
	})
	mustRelease(t, holder)
	mustAcquire(t, rl)
	for range 2 {
		select {
		case err := <-waits:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a wait of rl is still pacing itself while rl holds the lock (Holds %d)", rl.Holds())
		}
	}
	if n := rl.Holds(); n != 3 {
		t.Fatalf("Holds = %d, want 3", n)
	}
	for range 3 {
		mustRelease(t, rl)
	}
}

// wakeByRelease starts rl.AcquireWait (rl's store is s), lets its first
// attempt fail against holder, releases holder, and returns how long after
// the release the waiter had the lock. It fails t if the waiter is not woken
// within 10 s, far less than the retries and leases of its callers.
func wakeByRelease(t *testing.T, holder, rl *RedisLock, s *spy) time.Duration {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- rl.AcquireWait(context.Background()) }()
	// Its first attempt failed, it subscribed, and its attempt once
	// subscribed has failed too: it waits. (A fixed sleep here let a
	// loaded cluster's release come before that attempt.)
	for s.ended.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	mustRelease(t, holder)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not wake the waiter")
	}
	return time.Since(start)
}

// queueLen returns how many AcquireWaits wait on rl's channel in its hub.
func queueLen(rl *RedisLock) int { return rl.locker.wake.Queued(rl.names.channel) }

// requireNoHubs fails if a subscription of NewRedisLock's locks is still
// open a few seconds on.
func requireNoHubs(t testing.TB) {
	t.Helper()
	open := func() (n int) {
		eachDefaultLocker(func(l *Locker) { n += l.wake.Hubs() })
		return n
	}
	// A subscription lingers after its last waiter left (see linger).
	for end := time.Now().Add(5 * time.Second); open() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d subscriptions left open", open())
		}
	}
}

func mustGet(mr interface{ Get(string) (string, error) }, key string) string {
	v, _ := mr.Get(key)
	return v
}

// TestLimitRetryCountsLeaseEndAttempts: LimitRetry bounds attempts, not
// time, also with wake-ups working: behind a holder that renews, the
// attempt at the end of each of its leases counts.
func TestLimitRetryCountsLeaseEndAttempts(t *testing.T) {
	srv := redisserver.Start(t)
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), "limit", WithExpiry(time.Second))
	mustAcquire(t, holder)
	c := srv.Client(t)
	spied := newSpy(FromGoRedis(c))
	waiter := NewRedisLock(spied, "limit", WithPubSub(c), WithRetry(LimitRetry(FixedRetry(time.Hour), 3)))
	err := waiter.AcquireWait(context.Background())
	if !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("AcquireWait = %v, want ErrNotAcquired after 3 attempts", err)
	}
	// The first, the one after subscribing, and one at the holder's lease end.
	if n := spied.count(acquireScript); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
	mustRelease(t, holder)
}

// Found by the black-box review of round 12: the attempt timed for the end
// of a holder's lease could reach Redis while PTTL still said 0 (under a
// millisecond left), fail, and count, and the wait then tried again at once
// within that millisecond; with LimitRetry it gave up behind a key about to
// expire (8 of 30 runs). The attempt now comes a millisecond past the
// PTTL: behind a key that expires, the third attempt takes the lock.
func TestLeaseEndAttemptFindsTheKeyGone(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := srv.Client(t)
	ctx := context.Background()
	for i := range 20 {
		key := fmt.Sprintf("expiring:%d", i)
		if err := admin.Set(ctx, key, "outsider", 40*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		spied := newSpy(FromGoRedis(c))
		rl := NewRedisLock(spied, key, WithPubSub(c), WithRetry(LimitRetry(FixedRetry(5*time.Second), 3)))
		if err := rl.AcquireWait(ctx); err != nil {
			t.Fatalf("run %d: %v after %d attempts", i, err, spied.count(acquireScript))
		}
		if n := spied.count(acquireScript); n > 3 {
			t.Fatalf("run %d: %d attempts behind a key that expired", i, n)
		}
		mustRelease(t, rl)
	}
}

// noPubSub is a Subscriber that gives no PubSub.
type noPubSub struct{}

func (noPubSub) Subscribe(context.Context, ...string) *redis.PubSub { return nil }

// A wait whose Subscriber gave no PubSub joined again after every attempt
// and attempted again at once, unpaced; it now waits in a line without a
// subscription, paced by its RetryStrategy.
func TestWaitWithASubscriberThatGivesNoPubSubIsPaced(t *testing.T) {
	srv := redisserver.Start(t)
	const key = "no-pubsub"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key)
	mustAcquire(t, holder)
	spied := newSpy(FromGoRedis(srv.Client(t)))
	rl := NewRedisLock(spied, key, WithPubSub(noPubSub{}), WithRetry(FixedRetry(10*time.Millisecond)))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := rl.AcquireWait(ctx); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("AcquireWait = %v, want ErrNotAcquired", err)
	}
	// Every 10 ms for 300 ms is about 30 attempts.
	if n := spied.count(acquireScript); n > 60 {
		t.Fatalf("%d attempts in 300 ms: not paced", n)
	}
	mustRelease(t, holder)
}

// A release by a lock of the Locker lets the first of its waiters without
// pub/sub attempt at once, as a published release would: no message tells
// them (found in measuring the line without pub/sub: with 1 ms holds in one
// process, 319 acquisitions a second against 678 with pub/sub). A fair
// release hands the lock to a fair waiter of the Locker without pub/sub,
// which holds it at once, not at its next attempt (before, each handoff to
// it waited for its paced attempt, or its refresh at a third of its lease).
func TestReleaseHereWakesTheLineWithoutPubSub(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	for _, tc := range []struct {
		name    string
		opts    []Option
		release bool // by Release; else the watchdog's, at the maximum hold
		fair    bool // both locks are fair
	}{
		{"Release", nil, true, false},
		{"maximum hold", []Option{WithMaxHold(200 * time.Millisecond)}, false, false},
		{"fair handoff", nil, true, true},
		{"fair handoff at the maximum hold", []Option{WithMaxHold(200 * time.Millisecond)}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "quiet:" + tc.name
			fair := func(opts ...Option) []Option {
				if tc.fair {
					return append(opts, WithFairness())
				}
				return opts
			}
			holder := NewRedisLock(FromGoRedis(c), key, fair(append(tc.opts, WithExpiry(30*time.Second))...)...)
			mustAcquire(t, holder)
			// Its own attempts: at the holder's lease end, 30 s; a fair
			// waiter's refreshes, every 20 s.
			waiter := NewRedisLock(FromGoRedis(c), key, fair(WithPubSub(nil),
				WithRetry(FixedRetry(time.Hour)), WithExpiry(time.Minute))...)
			got := make(chan error, 1)
			go func() { got <- waiter.AcquireWait(context.Background()) }()
			if tc.fair {
				waitQueued(t, c, key, 1)
			} else {
				waitFor(t, 10*time.Second, "the waiter in line", func() bool { return queueLen(waiter) == 1 })
			}
			if tc.release {
				mustRelease(t, holder)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second): // its own next attempt: the holder's lease, 30 s
				t.Fatal("the waiter did not attempt when the lock was released beside it")
			}
			mustRelease(t, waiter)
			if !tc.release {
				holder.Release() // the hold ended at its maximum hold: give back its acquisition
			}
		})
	}
}
