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
