package redislock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"go.uber.org/goleak"

	"github.com/redislock/redislock/internal/redisserver"
)

// holders counts acquisitions, and how often more than one waiter believed
// it held the lock at once.
type holders struct{ in, overlaps, acquired atomic.Int64 }

// require fails t unless there were want acquisitions and no overlap.
func (h *holders) require(t *testing.T, want int) {
	t.Helper()
	if h.acquired.Load() != int64(want) || h.overlaps.Load() != 0 {
		t.Fatalf("%d of %d acquisitions, %d overlapping", h.acquired.Load(), want, h.overlaps.Load())
	}
}

// takeTurn waits for rl, holds it for hold, and releases it.
func (h *holders) takeTurn(ctx context.Context, rl *RedisLock, hold time.Duration) error {
	if err := rl.AcquireWait(ctx); err != nil {
		return err
	}
	if h.in.Add(1) != 1 {
		h.overlaps.Add(1)
	}
	time.Sleep(hold)
	h.acquired.Add(1)
	h.in.Add(-1)
	if ok, err := rl.Release(); !ok || err != nil {
		return errors.Join(errors.New("release failed"), err)
	}
	return nil
}

func TestRealWaitersTakeTurns(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	blocker := NewRedisLock(FromGoRedis(c), "turns", WithExpiry(30*time.Second))
	mustAcquire(t, blocker)

	const waiters, impatient = 32, 4
	var (
		wg   sync.WaitGroup
		h    holders
		errs = make(chan error, waiters+impatient)
	)
	// Impatient waiters give up at their deadline, within one retry
	// interval: the longest DefaultRetry waits (its jitter picks less).
	maxRetry := DefaultRetry.(expRetry).max
	for i := 0; i < impatient; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rl := NewRedisLock(FromGoRedis(c), "turns")
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			deadline, _ := ctx.Deadline()
			err := rl.AcquireWait(ctx)
			if late := time.Since(deadline); late > maxRetry {
				errs <- errors.New("an impatient waiter returned " + late.String() + " after its deadline")
			}
			if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				errs <- errors.Join(errors.New("impatient waiter"), err)
			}
		}()
	}
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := h.takeTurn(ctx, NewRedisLock(FromGoRedis(c), "turns"), time.Millisecond); err != nil {
				errs <- err
			}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the impatient ones give up meanwhile
	mustRelease(t, blocker)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.require(t, waiters)
	requireNoHubs(t)
	requireNoSubscribers(t, c, blocker.names.channel)
}

func TestRealReleaseEndsWaitNotLease(t *testing.T) {
	elapsed := requireReleaseWakes(t, redisserver.Start(t).Client(t), "long")
	t.Logf("release to acquisition: %v (holder's lease 30s)", elapsed)
}

// requireReleaseWakes has a waiter through c wait on a holder with a 30s
// lease, and checks that the release, not a timer, ends the wait: three
// attempts, one before subscribing, one once subscribed (both lose), and
// one after the wake-up. It returns how long
// after the release the waiter had the lock.
func requireReleaseWakes(t *testing.T, c pipelined, key string) time.Duration {
	t.Helper()
	holder := NewRedisLock(FromGoRedis(c), key, WithExpiry(30*time.Second))
	mustAcquire(t, holder)
	s := newSpy(FromGoRedis(c))
	rl := NewRedisLock(s, key, WithPubSub(c))
	elapsed := wakeByRelease(t, holder, rl, s)
	if n := s.count(acquireScript); n != 3 {
		t.Fatalf("%d attempts, want 3: the wake-up, not a timer, ended the wait", n)
	}
	mustRelease(t, rl)
	requireNoHubs(t)
	return elapsed
}

func TestRealSubscriptionKilledDuringWaits(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	blocker := NewRedisLock(FromGoRedis(c), "killed-sub", WithExpiry(30*time.Second))
	mustAcquire(t, blocker)
	const waiters = 8
	var (
		wg   sync.WaitGroup
		h    holders
		errs = make(chan error, waiters)
	)
	for i := 0; i < waiters; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := h.takeTurn(ctx, NewRedisLock(FromGoRedis(c), "killed-sub"), 20*time.Millisecond); err != nil {
				errs <- err
			}
		}()
	}
	for queueLen(blocker) < waiters {
		time.Sleep(time.Millisecond)
	}
	ctx := context.Background()
	kill := func() int64 {
		n, err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if kill() == 0 {
		t.Fatal("no pub/sub connection to kill")
	}
	mustRelease(t, blocker) // possibly while nobody is subscribed
	for h.acquired.Load() < waiters/2 {
		time.Sleep(5 * time.Millisecond)
	}
	kill() // and once more in the middle of the turns
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.require(t, waiters)
	requireNoHubs(t)
}

// TestRealWaitersOfOneProcessGoInArrivalOrder: waiters of one process
// queue, and only the first in line attempts, with pub/sub and without it
// (found by the black-box review of round 11: without pub/sub every waiter
// made its own paced attempts, and they acquired in no order).
func TestRealWaitersOfOneProcessGoInArrivalOrder(t *testing.T) {
	srv := redisserver.Start(t)
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"pubsub", nil},
		{"no pubsub", []Option{WithPubSub(nil), WithRetry(FixedRetry(10 * time.Millisecond))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "fifo:" + tc.name
			c := srv.Client(t)
			blocker := NewRedisLock(FromGoRedis(c), key, WithExpiry(30*time.Second))
			mustAcquire(t, blocker)
			spied := newSpy(FromGoRedis(c))
			const waiters = 10
			var (
				mu    sync.Mutex
				order []int
				wg    sync.WaitGroup
			)
			for i := 0; i < waiters; i++ {
				rl := NewRedisLock(spied, key, tc.opts...)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := rl.AcquireWait(context.Background()); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					time.Sleep(time.Millisecond)
					rl.Release()
				}()
				waitFor(t, 10*time.Second, "the waiter in line", func() bool { return queueLen(rl) == i+1 }) // arrived, in this order
			}
			before := spied.count(acquireScript)
			time.Sleep(300 * time.Millisecond)
			// The first in line alone, every 10 ms without pub/sub: about
			// 30 attempts; ten waiters, 300.
			if n := spied.count(acquireScript) - before; n > 60 {
				t.Errorf("%d attempts in 300 ms behind a holder: more than the first in line made them", n)
			}
			mustRelease(t, blocker)
			wg.Wait()
			if !slices.Equal(order, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) {
				t.Fatalf("acquisition order %v, want arrival order", order)
			}
		})
	}
}

func TestRealWaitersInTwoProcesses(t *testing.T) {
	// Two clients stand for two processes: each has its own subscription
	// and queue, and a release wakes the head of each.
	srv := redisserver.Start(t)
	clients := []*redis.Client{srv.Client(t), srv.Client(t)}
	s := newSpy(FromGoRedis(clients[0]))
	const perProcess, rounds = 8, 5
	var (
		wg sync.WaitGroup
		h  holders
	)
	for p, c := range clients {
		for i := 0; i < perProcess; i++ {
			var store Scripter = FromGoRedis(c)
			if p == 0 {
				store = s
			}
			rl := NewRedisLock(store, "two-procs", WithPubSub(c))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := 0; r < rounds; r++ {
					if err := h.takeTurn(context.Background(), rl, 500*time.Microsecond); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	h.require(t, len(clients)*perProcess*rounds)
	t.Logf("process 0: %d acquire attempts for %d acquisitions", s.count(acquireScript), perProcess*rounds)
	requireNoHubs(t)
}

// requireNoSubscribers fails if the server still counts subscribers of
// channel a few seconds on (unsubscribing is asynchronous).
func requireNoSubscribers(t *testing.T, c *redis.Client, channel string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := c.PubSubNumSub(context.Background(), channel).Val()[channel]
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers of %q left", n, channel)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRealWaiterTriesOnceAfterItsSubscriptionHeals: when the pub/sub
// connection is killed and go-redis resubscribes at once, a waiter makes
// an attempt for the release it may have missed and then waits on in
// silence, instead of pacing itself by its RetryStrategy (which spends
// LimitRetry) until a reconnection backoff is over.
func TestRealWaiterTriesOnceAfterItsSubscriptionHeals(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), "healed", WithExpiry(10*time.Second))
	mustAcquire(t, holder)
	c := srv.Client(t)
	spied := newSpy(FromGoRedis(c))
	waiter := NewRedisLock(spied, "healed", WithPubSub(c), WithRetry(LimitRetry(FixedRetry(25*time.Millisecond), 6)))
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(context.Background()) }()
	ctx := context.Background()
	subscribed := func() bool {
		n := admin.PubSubNumSub(ctx, waiter.names.channel).Val()
		return n[waiter.names.channel] == 1
	}
	waitFor(t, 10*time.Second, "the waiter subscribed, after its two attempts", func() bool {
		return subscribed() && spied.count(acquireScript) == 2
	})
	if n := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Val(); n != 1 {
		t.Fatalf("%d pub/sub connections killed, want 1", n)
	}
	waitFor(t, 10*time.Second, "the subscription back", subscribed)
	select {
	case err := <-got:
		t.Fatalf("AcquireWait gave up behind a renewing holder: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := spied.count(acquireScript) - 2; n > 3 {
		t.Fatalf("%d attempts after the kill, where one or two were due", n)
	}
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, waiter)
}

// TestSubscriptionLingersBetweenWaits: a busy key's usual round (wait,
// hold, release, wait again) keeps its subscription, which lingers after
// its last waiter left, instead of subscribing again for every wait (a
// fair hot key of 8 contenders over 4 processes opened a pub/sub connection
// for a fifth of its waits); it is closed once nobody waits.
func TestSubscriptionLingersBetweenWaits(t *testing.T) {
	srv := redisserver.Start(t)
	admin, c := srv.Client(t), srv.Client(t)
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), "lingers")
	const rounds = 20
	for range rounds {
		mustAcquire(t, holder)
		waiter := NewRedisLock(FromGoRedis(c), "lingers")
		waitBehind(t, holder, waiter)
	}
	// A round takes a few round trips; a slow one (more than linger) may
	// subscribe again.
	if n := commandCalls(t, admin, "subscribe"); n > rounds/4 {
		t.Fatalf("%d SUBSCRIBEs for %d waits one after another, want about 1", n, rounds)
	}
	requireNoHubs(t)
	requireNoSubscribers(t, admin, relatedName("lingers", "released"))
}

// waitBehind makes waiter wait in line for the lock that holder holds, take
// it at holder's release, and release it. A fair waiter is in line once it
// is queued in Redis.
func waitBehind(t *testing.T, holder, waiter *RedisLock) {
	t.Helper()
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(context.Background()) }()
	waitFor(t, 10*time.Second, "the waiter in line", func() bool {
		if waiter.fair() {
			st, err := holder.Inspect(context.Background())
			return err == nil && st.Waiters == 1
		}
		return queueLen(waiter) == 1
	})
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, waiter)
}

// TestLockerCloseClosesLingeringSubscriptions: Close closes a subscription
// that lingers after its last waiter left, and returns once its reader has.
func TestLockerCloseClosesLingeringSubscriptions(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), "close:lingering")
	mustAcquire(t, holder)
	before := goleak.IgnoreCurrent()
	l := NewLocker(FromGoRedis(c))
	waiter := l.NewLock("close:lingering")
	waitBehind(t, holder, waiter)
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a subscription lingering")
	}
	requireLockerIdle(t, l)
	if err := goleak.Find(before); err != nil {
		t.Fatalf("after Close: %v", err)
	}
}

// TestLockerCloseWithALingeringChannelAndAWaiter: a hub with a waiter of
// one key and a channel of another lingering closes when Close ends that
// waiter's wait (its lingering channel held it open, and Close waited for
// its reader for ever).
func TestLockerCloseWithALingeringChannelAndAWaiter(t *testing.T) {
	srv := redisserver.Start(t)
	c, other := srv.Client(t), srv.Client(t)
	l := NewLocker(FromGoRedis(c))
	mustAcquire(t, NewRedisLock(FromGoRedis(other), "close:b"))
	waiting := l.NewLock("close:b")
	got := make(chan error, 1)
	go func() { got <- waiting.AcquireWait(context.Background()) }()
	waitFor(t, 10*time.Second, "the waiter of b in line", func() bool { return queueLen(waiting) == 1 })
	holder := NewRedisLock(FromGoRedis(other), "close:a")
	mustAcquire(t, holder)
	waitBehind(t, holder, l.NewLock("close:a")) // a's channel lingers
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := <-got; !errors.Is(err, ErrLockerClosed) {
		t.Fatalf("the wait of b = %v, want ErrLockerClosed", err)
	}
	requireLockerIdle(t, l)
}
