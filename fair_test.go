package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// fairQueueLen returns how many waiters the queue of key holds in Redis.
func fairQueueLen(t testing.TB, c *redis.Client, key string) int64 {
	t.Helper()
	n, err := c.ZCard(context.Background(), relatedName(key, "queue")).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitQueued waits (10 s at most) until key's queue holds n waiters.
func waitQueued(t testing.TB, c *redis.Client, key string, n int64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); fairQueueLen(t, c, key) != n; {
		if time.Now().After(end) {
			t.Fatalf("the queue of %q holds %d waiters, want %d", key, fairQueueLen(t, c, key), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFairOrderAcrossClients: waiters on clients of their own (standing in
// for processes) that queue in a known order acquire in that order, each
// handed the lock by its predecessor's release.
func TestFairOrderAcrossClients(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const n = 8
	key := "fair:order"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
	mustAcquire(t, holder)

	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 1; i <= n; i++ {
		c := srv.Client(t)
		spied := newSpy(FromGoRedis(c))
		rl := NewRedisLock(spied, key, WithFairness(), WithPubSub(c))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rl.AcquireWait(context.Background()); err != nil {
				errs <- err
				return
			}
			attempts := spied.count(fairAcquireScript)
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if attempts != 2 { // the first attempt, and the one that queued
				errs <- fmt.Errorf("waiter %d made %d attempts; the handoff should make none", i, attempts)
			}
			if ok, err := rl.Release(); !ok || err != nil {
				errs <- fmt.Errorf("waiter %d release: %v %v", i, ok, err)
			}
		}()
		waitQueued(t, admin, key, int64(i)) // arrived before the next one starts
	}
	mustRelease(t, holder)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, got := range order {
		if got != i+1 {
			t.Fatalf("acquired in order %v, want 1..%d", order, n)
		}
	}
	if len(order) != n {
		t.Fatalf("%d of %d waiters acquired", len(order), n)
	}
	if fairQueueLen(t, admin, key) != 0 {
		t.Error("the queue is not empty")
	}
}

// TestFairAcquireCtxDoesNotJumpTheQueue: a single attempt on a free fair
// lock fails while a live waiter is queued; a plain lock barges in.
func TestFairAcquireCtxDoesNotJumpTheQueue(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	key := "fair:nojump"
	lease := WithExpiry(time.Second)
	holder := NewRedisLock(FromGoRedis(c), key, WithFairness(), lease)
	mustAcquire(t, holder)
	waiter := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), lease)
	done := make(chan error, 1)
	go func() { done <- waiter.AcquireWait(context.Background()) }()
	waitQueued(t, c, key, 1)
	// Free the key behind the queue's back, as a plain client's release
	// would: no handoff, no message.
	if err := c.Del(context.Background(), key).Err(); err != nil {
		t.Fatal(err)
	}
	other := NewRedisLock(FromGoRedis(c), key, WithFairness())
	if ok, err := other.Acquire(); ok || err != nil {
		t.Fatalf("a fair Acquire took a free key with a live waiter queued: %v %v", ok, err)
	}
	select {
	case err := <-done: // its timed attempt, at the end of the holder's lease
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not take the freed key within the holder's lease")
	}
	mustRelease(t, waiter)
	if _, err := holder.Release(); !errors.Is(err, ErrLockLost) {
		t.Errorf("the first holder's release: %v, want ErrLockLost", err)
	}
}

// fairOrder runs n waiters of key, each on a client of its own made by
// newClient, queued one after another, and returns the order in which they
// acquired (each takes a fenced token above its predecessor's).
func fairOrder(t *testing.T, n int, key string, admin redis.UniversalClient, newStore func(i int) (Scripter, Subscriber)) []int {
	t.Helper()
	store, ps := newStore(0)
	holder := NewRedisLock(store, key, WithFairness(), WithFencing(), WithPubSub(ps))
	mustAcquire(t, holder)
	var mu sync.Mutex
	var order []int
	last := holder.Token()
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		store, ps := newStore(i)
		rl := NewRedisLock(store, key, WithFairness(), WithFencing(), WithPubSub(ps))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rl.AcquireWait(context.Background()); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			if rl.Token() <= last {
				t.Errorf("waiter %d: token %d not above %d", i, rl.Token(), last)
			}
			last = rl.Token()
			order = append(order, i)
			mu.Unlock()
			mustRelease(t, rl)
		}()
		for end := time.Now().Add(10 * time.Second); admin.ZCard(context.Background(), relatedName(key, "queue")).Val() != int64(i); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("waiter %d did not queue", i)
			}
		}
	}
	mustRelease(t, holder)
	wg.Wait()
	return order
}

// TestFairOnClusterAndGoZero: fair locks keep arrival order through a
// ClusterClient (keys on several nodes, the queue in the key's slot) and
// through go-zero's store (EVAL, wake-ups through WithPubSub).
func TestFairOnClusterAndGoZero(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		c, _ := startCluster(t)
		for _, key := range []string{"fair:alpha", "fair:beta", "{fair}:gamma"} {
			order := fairOrder(t, 4, key, c, func(int) (Scripter, Subscriber) { return FromGoRedis(c), c })
			if fmt.Sprint(order) != "[1 2 3 4]" {
				t.Errorf("%q: acquired in order %v", key, order)
			}
		}
	})
	t.Run("go-zero", func(t *testing.T) {
		srv := redisserver.Start(t)
		admin := srv.Client(t)
		order := fairOrder(t, 4, "fair:gozero-store", admin, func(int) (Scripter, Subscriber) {
			return goZeroStore(t, srv.Addr), srv.Client(t)
		})
		if fmt.Sprint(order) != "[1 2 3 4]" {
			t.Errorf("acquired in order %v", order)
		}
	})
}

// TestFairLockSemantics: re-entry, Do, WithMaxHold, loss and Locker.Close
// work on fair locks as on others, and a handed hold that ends passes the
// lock on to the next waiter.
func TestFairLockSemantics(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()

	t.Run("re-entry and Do", func(t *testing.T) {
		rl := NewRedisLock(FromGoRedis(srv.Client(t)), "fair:reenter", WithFairness())
		err := rl.Do(ctx, func(ctx context.Context) error {
			return rl.Do(ctx, func(context.Context) error {
				if rl.Holds() != 2 {
					return fmt.Errorf("holds %d inside a nested Do", rl.Holds())
				}
				return nil
			})
		})
		if err != nil || rl.Holds() != 0 || admin.Exists(ctx, "fair:reenter").Val() != 0 {
			t.Fatalf("Do: %v, holds %d afterwards", err, rl.Holds())
		}
	})

	t.Run("goroutines of one RedisLock", func(t *testing.T) {
		key := "fair:shared"
		holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
		mustAcquire(t, holder)
		rl := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := rl.AcquireWait(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		waitQueued(t, admin, key, 1) // one of them queues; the others wait behind it
		time.Sleep(20 * time.Millisecond)
		if n := fairQueueLen(t, admin, key); n != 1 {
			t.Fatalf("%d entries queued for one RedisLock", n)
		}
		mustRelease(t, holder)
		wg.Wait()
		if rl.Holds() != 4 {
			t.Fatalf("holds %d after 4 waits", rl.Holds())
		}
		for range 4 {
			mustRelease(t, rl)
		}
		if admin.Exists(ctx, key).Val() != 0 {
			t.Fatal("the key is left after the last release")
		}
	})

	t.Run("maximum hold of a handed hold passes it on", func(t *testing.T) {
		key := "fair:maxhold"
		holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
		mustAcquire(t, holder)
		stuck := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithMaxHold(200*time.Millisecond))
		go func() { _ = stuck.AcquireWait(ctx) }()
		waitQueued(t, admin, key, 1)
		next := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
		got := make(chan error, 1)
		go func() { got <- next.AcquireWait(ctx) }()
		waitQueued(t, admin, key, 2)
		mustRelease(t, holder)
		if err := <-got; err != nil { // after stuck's maximum hold, not its 10s lease
			t.Fatal(err)
		}
		waitDone(t, stuck.Done(), "the stuck hold's end")
		if !errors.Is(stuck.Err(), ErrMaxHoldExceeded) {
			t.Fatalf("the stuck hold ended with %v", stuck.Err())
		}
		if _, err := stuck.Release(); !errors.Is(err, ErrMaxHoldExceeded) {
			t.Fatalf("its release: %v", err)
		}
		mustRelease(t, next)
	})

	t.Run("loss of a handed hold", func(t *testing.T) {
		key := "fair:lost"
		holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
		mustAcquire(t, holder)
		rl := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(300*time.Millisecond))
		got := make(chan error, 1)
		go func() { got <- rl.AcquireWait(ctx) }()
		waitQueued(t, admin, key, 1)
		mustRelease(t, holder)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		admin.Set(ctx, key, "outsider", 0)
		waitDone(t, rl.Done(), "the loss")
		if !errors.Is(rl.Err(), ErrLockLost) {
			t.Fatalf("ended with %v", rl.Err())
		}
		if _, err := rl.Release(); !errors.Is(err, ErrLockLost) || admin.Get(ctx, key).Val() != "outsider" {
			t.Fatalf("release after the loss: %v; the key holds %q", err, admin.Get(ctx, key).Val())
		}
		admin.Del(ctx, key)
	})

	t.Run("Locker closed while waiting", func(t *testing.T) {
		key := "fair:closed"
		holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
		mustAcquire(t, holder)
		l := NewLocker(FromGoRedis(srv.Client(t)), WithFairness())
		errs := make(chan error, 3)
		for range 3 {
			rl := l.NewLock(key)
			go func() { errs <- rl.AcquireWait(ctx) }()
		}
		waitQueued(t, admin, key, 3)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := <-errs; !errors.Is(err, ErrLockerClosed) {
				t.Fatalf("a wait of a closed Locker: %v", err)
			}
		}
		waitGiveBacks()
		if n := fairQueueLen(t, admin, key); n != 0 {
			t.Fatalf("%d waiters left queued after Close", n)
		}
		next := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
		got := make(chan error, 1)
		go func() { got <- next.AcquireWait(ctx) }()
		waitQueued(t, admin, key, 1)
		mustRelease(t, holder)
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		mustRelease(t, next)
	})
}

// TestFairRacesOnOneLock: every public call races every other on one fair
// RedisLock, against a second one on the same key, with contexts ending at
// random moments. Nothing panics or races, a nil AcquireWait always holds,
// the two never hold at once by the key, and once all is released nothing
// is left in Redis.
func TestFairRacesOnOneLock(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	key := "fair:races"
	a := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(500*time.Millisecond))
	b := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(500*time.Millisecond))
	ctx := context.Background()
	end := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	var overlaps, nilWithout atomic.Int64
	for g := 0; g < 8; g++ {
		rl := a
		if g%2 == 1 {
			rl = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				wctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
				switch i % 4 {
				case 0, 1:
					if err := rl.AcquireWait(wctx); err == nil {
						if rl.Holds() == 0 && rl.Err() == nil {
							nilWithout.Add(1)
						}
						if a.Holds() > 0 && b.Holds() > 0 {
							overlaps.Add(1)
						}
						_, _ = rl.Release()
					}
				case 2:
					if ok, _ := rl.AcquireCtx(wctx); ok {
						_, _ = rl.TTL(wctx)
						_, _ = rl.ReleaseCtx(wctx)
					}
				case 3:
					_, _ = rl.TTL(wctx)
					_ = rl.Until()
					_ = rl.Token()
					<-rl.Done()
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	releaseAll(a, b) // acquisitions of holds that ended meanwhile
	waitGiveBacks()
	if n := nilWithout.Load(); n > 0 {
		t.Errorf("AcquireWait returned nil without the lock %d times", n)
	}
	if n := overlaps.Load(); n > 0 {
		t.Errorf("both locks held at once %d times", n)
	}
	waitFor(t, 5*time.Second, "the key released", func() bool { return admin.Exists(ctx, key).Val() == 0 })
	waitKeysGone(t, admin, key, 3*time.Second)
}

// TestFairWaiterTracksTheNewHolder: a waiter that hears the lock handed to
// another waiter attempts no later than that waiter's lease would end:
// when the new holder's key expires unreleased (its holding context ended),
// the next waiter takes it then, not when the previous holder's much
// longer lease would have ended. (Found by the black-box review: the next
// waiter slept out the previous holder's 6 s lease.)
func TestFairWaiterTracksTheNewHolder(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	key := "fair:new-holder"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(6*time.Second))
	mustAcquire(t, holder)
	short := WithExpiry(300 * time.Millisecond)
	first := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), short)
	firstCtx, endFirst := context.WithCancel(context.Background())
	defer endFirst()
	got := make(chan error, 1)
	go func() { got <- first.AcquireWait(firstCtx) }()
	waitQueued(t, admin, key, 1)
	second := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), short)
	secondGot := make(chan error, 1)
	go func() { secondGot <- second.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 2)
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	endFirst() // its key lasts out its 300 ms lease, unreleased
	select {
	case err := <-secondGot:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(4 * time.Second): // the previous holder's lease was 6 s
		t.Fatal("the next waiter did not take the key when the new holder's lease ran out")
	}
	mustRelease(t, second)
	first.Release()
}

// TestFairGiveUpLeavesTheQueueBeforeReturning: a wait that gives up (its
// context, its wait timeout, its Locker closed) has left the queue when
// AcquireWait returns, so a process that exits at once leaves no waiter
// to be handed the lock. (Black-box round 7: the entry was removed in the
// background, after the return.)
func TestFairGiveUpLeavesTheQueueBeforeReturning(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	key := "fair:give-up"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
	mustAcquire(t, holder)
	for _, mode := range []string{"context", "wait timeout", "locker closed"} {
		var err error
		switch mode {
		case "context":
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			err = NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness()).AcquireWait(ctx)
			cancel()
		case "wait timeout":
			rl := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithWaitTimeout(100*time.Millisecond))
			err = rl.AcquireWait(context.Background())
		case "locker closed":
			l := NewLocker(FromGoRedis(srv.Client(t)), WithFairness())
			go func() {
				for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
					if admin.ZCard(context.Background(), relatedName(key, "queue")).Val() == 1 {
						break
					}
				}
				l.Close()
			}()
			err = l.NewLock(key).AcquireWait(context.Background())
		}
		if !errors.Is(err, ErrNotAcquired) && !errors.Is(err, ErrLockerClosed) {
			t.Fatalf("%s: %v", mode, err)
		}
		if n := fairQueueLen(t, admin, key); n != 0 {
			t.Errorf("%s: %d entries queued when AcquireWait returned", mode, n)
		}
	}
	mustRelease(t, holder)
}

// TestFairWaitReportsAnInvalidLease: a fair wait that queues at once (the
// process is subscribed to the key already) reports an invalid lease as
// ErrInvalidExpiry, as a first attempt would, and sends nothing.
func TestFairWaitReportsAnInvalidLease(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := srv.Client(t)
	key := "fair:bad-lease"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
	mustAcquire(t, holder)
	waiting := NewRedisLock(FromGoRedis(c), key, WithFairness())
	got := make(chan error, 1)
	go func() { got <- waiting.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 1) // this client's hub is subscribed now
	bad := NewRedisLock(FromGoRedis(c), key, WithFairness())
	bad.SetExpire(-1)
	if err := bad.AcquireWait(context.Background()); !errors.Is(err, ErrInvalidExpiry) {
		t.Fatalf("AcquireWait with an invalid lease: %v", err)
	}
	if n := fairQueueLen(t, admin, key); n != 1 {
		t.Fatalf("%d queued", n)
	}
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, waiting)
}

// TestFairFencedWaiterGetsATokenFromAnyHolder: the handoff mints a token
// for a fenced waiter whatever the releasing lock's options: an unfenced
// fair holder hands a fenced waiter a token above every one before.
// (Black-box round 8: the token was 0.)
func TestFairFencedWaiterGetsATokenFromAnyHolder(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	key := "fair:mixed-fencing"
	earlier := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithFencing())
	mustAcquire(t, earlier)
	first := earlier.Token()
	mustRelease(t, earlier)
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness()) // not fenced
	mustAcquire(t, holder)
	waiter := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithFencing())
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 1)
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	counter, _ := admin.Get(context.Background(), relatedName(key, "fence")).Int64()
	if waiter.Token() <= first || waiter.Token() != counter {
		t.Fatalf("handed token %d (earlier %d, counter %d)", waiter.Token(), first, counter)
	}
	mustRelease(t, waiter)
}

// TestFairLongLeaseWaiterKeepsItsPlace: a waiter with a long lease queued
// behind one with a short lease keeps its place after the short one gives
// up: the queue lives two windows of its latest waiter, not of its first.
// (Issue 17, defect 1: the queue expired with the first waiter's window,
// Inspect showed 0 waiters, and a later arrival took the lock first.)
func TestFairLongLeaseWaiterKeepsItsPlace(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	key := "fair:long-lease"
	lock := func(lease time.Duration) *RedisLock {
		return NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(lease))
	}
	holder := lock(6 * time.Second)
	mustAcquire(t, holder)
	shortCtx, giveUp := context.WithCancel(context.Background())
	shortGot := make(chan error, 1)
	go func() { shortGot <- lock(100 * time.Millisecond).AcquireWait(shortCtx) }()
	waitQueued(t, admin, key, 1)
	long := lock(3 * time.Second)
	longGot := make(chan error, 1)
	go func() { longGot <- long.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 2)
	giveUp()
	if err := <-shortGot; !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("short waiter: %v", err)
	}
	time.Sleep(500 * time.Millisecond) // past two windows of the short waiter, before the long one's first refresh
	if st, err := holder.Inspect(context.Background()); err != nil || st.Waiters != 1 {
		t.Fatalf("Inspect = %+v, %v; want the long waiter live", st, err)
	}
	late := lock(3 * time.Second)
	lateGot := make(chan error, 1)
	go func() { lateGot <- late.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 2)
	mustRelease(t, holder)
	if err := <-longGot; err != nil {
		t.Fatalf("long waiter: %v", err)
	}
	select {
	case err := <-lateGot:
		t.Fatalf("the later arrival got the lock (%v) while the long waiter held it", err)
	default:
	}
	mustRelease(t, long)
	if err := <-lateGot; err != nil {
		t.Fatalf("late waiter: %v", err)
	}
	mustRelease(t, late)
}

// TestFairWaiterStaysLiveOnItsOwnRetries: a fair waiter stays live by
// attempting every third of its lease; those attempts neither spend its
// RetryStrategy (three attempts here: the first, which finds the lock
// busy, and the one that queues spend two) nor lose its place to a later
// waiter.
func TestFairWaiterStaysLiveOnItsOwnRetries(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const key = "fair:live"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(5*time.Second))
	mustAcquire(t, holder)
	c := srv.Client(t)
	spied := newSpy(FromGoRedis(c))
	first := NewRedisLock(spied, key, WithFairness(), WithPubSub(c), WithExpiry(300*time.Millisecond),
		WithRetry(LimitRetry(FixedRetry(10*time.Millisecond), 3)))
	got := make(chan error, 2)
	go func() { got <- first.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 1)
	time.Sleep(time.Second) // three lapses of its lease, had it not stayed live
	later := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
	go func() { got <- later.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 2)
	if n := spied.count(fairAcquireScript); n < 5 {
		t.Fatalf("the waiter made %d attempts in a second: it did not stay live by attempting", n)
	}
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatalf("the first waiter: %v", err)
	}
	if first.Holds() != 1 || later.Holds() != 0 {
		t.Fatalf("handed to the later waiter (first holds %d)", first.Holds())
	}
	mustRelease(t, first)
	if err := <-got; err != nil {
		t.Fatalf("the later waiter: %v", err)
	}
	mustRelease(t, later)
}

// TestFairPlaceOutlivesTheCallThatGaveUp: the waiter of a RedisLock is
// the RedisLock's. When the call that queued it gives up while another
// call of the same RedisLock waits, the other waits on in its place, ahead
// of a later arrival; the last call out leaves nothing queued.
func TestFairPlaceOutlivesTheCallThatGaveUp(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const key = "fair:place"
	fair := func() *RedisLock { return NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness()) }
	holder, shared, later := fair(), fair(), fair()
	mustAcquire(t, holder)
	ctx1, giveUp := context.WithCancel(context.Background())
	first, second, third := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	go func() { first <- shared.AcquireWait(ctx1) }()
	waitQueued(t, admin, key, 1)
	go func() { second <- shared.AcquireWait(context.Background()) }()
	waitFor(t, 10*time.Second, "the second call waiting for its turn", func() bool {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		return shared.line.waits == 2
	})
	go func() { third <- later.AcquireWait(context.Background()) }()
	waitQueued(t, admin, key, 2)
	giveUp()
	if err := <-first; !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("the call that gave up: %v", err)
	}
	if n := fairQueueLen(t, admin, key); n != 2 {
		t.Fatalf("%d waiters queued after one call of two gave up, want 2", n)
	}
	mustRelease(t, holder)
	if err := <-second; err != nil {
		t.Fatalf("the call that waited on: %v", err)
	}
	if later.Holds() != 0 {
		t.Fatal("a later arrival overtook the RedisLock that waited on")
	}
	mustRelease(t, shared)
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, later)
	if n := fairQueueLen(t, admin, key); n != 0 {
		t.Fatalf("%d waiters left queued", n)
	}

	// Alone, a call that gives up leaves the queue before it returns.
	mustAcquire(t, holder)
	ctx2, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := shared.AcquireWait(ctx2); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("the lone call: %v", err)
	}
	if n := fairQueueLen(t, admin, key); n != 0 {
		t.Fatalf("%d waiters queued after the lone call gave up", n)
	}
	mustRelease(t, holder)
}

// Found by the black-box review of round 6: when the first waiter of a fair
// lock was fenced and the fencing counter corrupt, the holder's Release
// reported ErrCorruptFencingCounter although it had released (the key was
// deleted, Done closed, Err nil), and the fenced waiter was dropped from
// the queue. Now the release succeeds, the waiter stays first and learns
// of the counter from its own attempt, and the waiter behind it gets the
// lock.
func TestFairReleaseWithCorruptCounterForTheNextWaiter(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), "corrupt", WithFairness())
	mustAcquire(t, holder)
	fenced := NewRedisLock(FromGoRedis(srv.Client(t)), "corrupt", WithFairness(), WithFencing())
	plain := NewRedisLock(FromGoRedis(srv.Client(t)), "corrupt", WithFairness())
	fencedErr, plainErr := make(chan error, 1), make(chan error, 1)
	go func() { fencedErr <- fenced.AcquireWait(ctx) }()
	waitFor(t, 10*time.Second, "the fenced waiter to queue", func() bool {
		return c.ZCard(ctx, relatedName("corrupt", "queue")).Val() == 1
	})
	go func() { plainErr <- plain.AcquireWait(ctx) }()
	waitFor(t, 10*time.Second, "the second waiter to queue", func() bool {
		return c.ZCard(ctx, relatedName("corrupt", "queue")).Val() == 2
	})
	c.Set(ctx, relatedName("corrupt", "fence"), "garbage", 0)
	if ok, err := holder.Release(); !ok || err != nil {
		t.Fatalf("Release = %v, %v; want true, nil: the holder released", ok, err)
	}
	if err := <-fencedErr; !errors.Is(err, ErrCorruptFencingCounter) {
		t.Fatalf("the fenced waiter: %v, want ErrCorruptFencingCounter", err)
	}
	if err := <-plainErr; err != nil {
		t.Fatalf("the waiter behind it: %v", err)
	}
	if owner := c.Get(ctx, "corrupt").Val(); owner != plain.Owner() {
		t.Fatalf("the key holds %q, want the second waiter's %q", owner, plain.Owner())
	}
	mustRelease(t, plain)
}

// TestFairWaitCountsItsFirstAttempt: every failed attempt of a fair wait
// counts against its RetryStrategy but its refreshes, the first one too
// (which does not queue): with LimitRetry of one attempt, a wait on a busy
// lock makes that one attempt, gives up, and leaves nothing queued.
func TestFairWaitCountsItsFirstAttempt(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const key = "fair:once"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
	mustAcquire(t, holder)
	c := srv.Client(t)
	spied := newSpy(FromGoRedis(c))
	once := NewRedisLock(spied, key, WithFairness(), WithPubSub(c), WithRetry(LimitRetry(FixedRetry(time.Millisecond), 1)))
	if err := once.AcquireWait(context.Background()); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("AcquireWait = %v, want ErrNotAcquired", err)
	}
	if n := spied.count(fairAcquireScript); n != 1 {
		t.Fatalf("%d attempts, want 1", n)
	}
	if n := fairQueueLen(t, admin, key); n != 0 {
		t.Fatalf("%d waiters queued after the wait gave up", n)
	}
	mustRelease(t, holder)
}

// TestFairWaitWithoutPubSubJoinsAtOnce: a fair wait without pub/sub has no
// subscription to make before it queues, so its first attempt queues it (it
// made an attempt that did not queue, then another that did).
func TestFairWaitWithoutPubSubJoinsAtOnce(t *testing.T) {
	srv := redisserver.Start(t)
	const key = "fair:joins"
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness())
	mustAcquire(t, holder)
	c := srv.Client(t)
	spied := newSpy(FromGoRedis(c))
	// Its next attempt would come in an hour; its refresh in 20 s.
	waiter := NewRedisLock(spied, key, WithFairness(), WithPubSub(nil), WithRetry(FixedRetry(time.Hour)), WithExpiry(time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(ctx) }()
	waitQueued(t, c, key, 1)
	if n := spied.count(fairAcquireScript); n != 1 {
		t.Fatalf("%d attempts to queue, want 1", n)
	}
	cancel()
	if err := <-got; !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("AcquireWait = %v, want ErrNotAcquired", err)
	}
	mustRelease(t, holder)
}

// TestFairRefreshesDoNotPutOffCountedAttempts: behind a holder that renews,
// a fair waiter's refreshes (every third of its own, shorter, lease) learn
// the holder's renewed lease each time; the attempt that counts still comes
// when the lease learnt by the last counted attempt ends, so LimitRetry
// runs out instead of the wait lasting as long as its context.
func TestFairRefreshesDoNotPutOffCountedAttempts(t *testing.T) {
	srv := redisserver.Start(t)
	for _, tc := range []struct {
		name string
		opts func(c *redis.Client) []Option
	}{
		{"pubsub", func(c *redis.Client) []Option {
			return []Option{WithPubSub(c), WithRetry(LimitRetry(FixedRetry(10*time.Millisecond), 3))}
		}},
		{"no pubsub, a pace longer than the holder's lease", func(*redis.Client) []Option {
			return []Option{WithPubSub(nil), WithRetry(LimitRetry(FixedRetry(5*time.Second), 3))}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "fair:limit:" + tc.name
			holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithExpiry(time.Second)) // renewed every third of a second
			mustAcquire(t, holder)
			c := srv.Client(t)
			spied := newSpy(FromGoRedis(c))
			waiter := NewRedisLock(spied, key, append(tc.opts(c), WithFairness(), WithExpiry(150*time.Millisecond))...)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := waiter.AcquireWait(ctx)
			if !errors.Is(err, ErrNotAcquired) || ctx.Err() != nil {
				t.Fatalf("AcquireWait = %v (context: %v), want ErrNotAcquired from LimitRetry", err, ctx.Err())
			}
			if n := spied.count(fairAcquireScript); n <= 3 {
				t.Fatalf("%d attempts: the waiter made no refresh between its counted ones", n)
			}
			mustRelease(t, holder)
		})
	}
}
