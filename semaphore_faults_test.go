package redislock

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// TestFaultPermitReplyLost: the proxy drops the reply of a semaphore's or
// a shared lock's scripts after they ran, and the client retries. An
// attempt that ran holds (also on a semaphore its own permit filled); a
// release that ran is a release; renewals, re-entries and TTL keep the
// permit. (A permit's attempt that reaches the server after it was given
// up is case 8b.)
func TestFaultPermitReplyLost(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	px := startProxy(t, srv.Addr)
	ctx := context.Background()
	stores := retryingStores(t, px)
	fc := &faultCount{t: t}
	holds := func(key string, rl *RedisLock) bool {
		_, err := admin.ZScore(ctx, relatedName(key, "holders"), rl.Owner()).Result()
		return err == nil
	}
	for name, newStore := range stores {
		store := newStore()
		for _, kind := range []struct {
			name string
			opts []Option
		}{
			{"1 permit", []Option{WithPermits(1)}}, {"3 permits", []Option{WithPermits(3)}}, {"shared", []Option{WithShared()}},
			{"1 permit, fenced", []Option{WithPermits(1), WithFencing()}}, {"shared, fenced", []Option{WithShared(), WithFencing()}},
		} {
			key := fmt.Sprintf("lost:%s:%s", name, kind.name)
			other := NewRedisLock(store, key, kind.opts...) // warms a connection; but for 1 permit, holds on
			mustAcquire(t, other)
			if strings.HasPrefix(kind.name, "1 permit") {
				mustRelease(t, other)
			}
			rl := NewRedisLock(store, key, append(kind.opts, WithExpiry(1500*time.Millisecond))...)
			fc.replyDropped(px, key+" acquire", func() {
				if ok, err := rl.Acquire(); !ok || err != nil {
					fc.violate("%s: Acquire after a lost reply = %v, %v", key, ok, err)
				}
			})
			if !holds(key, rl) {
				fc.violate("%s: not a holder after its acquisition", key)
			}
			if token, err := admin.ZScore(ctx, relatedName(key, "holders"), "#"+rl.Owner()).Result(); rl.Token() != 0 && (err != nil || int64(token) != rl.Token()) {
				fc.violate("%s: token %d, kept %v (%v)", key, rl.Token(), token, err)
			}
			fc.replyDropped(px, key+" re-entry", func() {
				if ok, err := rl.Acquire(); !ok || err != nil {
					fc.violate("%s: re-entry after a lost reply = %v, %v", key, ok, err)
				}
			})
			fc.replyDropped(px, key+" ttl", func() {
				if ttl, err := rl.TTL(ctx); err != nil || ttl <= 0 {
					fc.violate("%s: TTL after a lost reply = %v, %v", key, ttl, err)
				}
			})
			fc.replyDropped(px, key+" renewal", func() {
				until := rl.Until()
				waitFor(t, 10*time.Second, "a renewal's reply dropped", func() bool { return px.dropReplies.Load() <= 0 })
				waitFor(t, 10*time.Second, "a renewal after it", func() bool { return rl.Until().After(until) || isClosed(rl.Done()) })
			})
			if isClosed(rl.Done()) || !holds(key, rl) {
				fc.violate("%s: a renewal after a lost reply lost the permit: %v", key, rl.Err())
			}
			mustRelease(t, rl) // the re-entry: no round trip
			fc.replyDropped(px, key+" release", func() {
				if ok, err := rl.Release(); !ok || err != nil {
					fc.violate("%s: Release after a lost reply = %v, %v", key, ok, err)
				}
			})
			if holds(key, rl) || rl.Err() != nil {
				fc.violate("%s: after its release, still a holder %v, Err %v", key, holds(key, rl), rl.Err())
			}
			if !strings.HasPrefix(kind.name, "1 permit") {
				mustRelease(t, other)
				if admin.Exists(ctx, key).Val() != 0 {
					fc.violate("%s: the key outlives its last holder", key)
				}
			}
		}
	}
	recordFault(t, faultRow{
		Case:      "23. semaphore and shared: reply lost after the script ran",
		Injection: "the proxy closes the connection instead of forwarding the reply of a permit's or a share's acquire, re-entry, TTL, renewal or release (go-redis and go-zero retry)",
		Promise:   "an attempt that ran holds, even on the permit it filled, with its token; a release that ran is a release; renewals keep the permit",
		Runs:      fc.runs, Faults: px.replyDrops.Load(), Violations: fc.violations,
	})
}

// TestClusterSemaphoresAndShares: on 3 primaries, semaphores and shared
// locks on keys of several slots (with a hash tag, and with a stray '}')
// admit n holders, renew them in the Locker's batches per server, wake a
// waiter, and are inspected and broken; a fair release hands shares on.
func TestClusterSemaphoresAndShares(t *testing.T) {
	c, _ := startCluster(t)
	ctx := context.Background()
	l := NewLocker(FromGoRedis(c))
	defer l.Close()
	nodes := map[string]bool{}
	for _, key := range []string{"pool:a", "pool:b", "pool:c", "{user:1}:pool", "a}b"} {
		sem := func() *RedisLock { return l.NewLock(key, WithPermits(2), WithExpiry(300*time.Millisecond)) }
		a, b, d := sem(), sem(), sem()
		mustAcquire(t, a)
		mustAcquire(t, b)
		if ok, err := d.Acquire(); ok || err != nil {
			t.Fatalf("%q: a third holder of 2: %v, %v", key, ok, err)
		}
		until := a.Until()
		waitFor(t, 10*time.Second, "a renewal", func() bool { return a.Until().After(until) })
		got := make(chan error, 1)
		go func() { got <- d.AcquireWait(ctx) }()
		mustRelease(t, b)
		if err := <-got; err != nil {
			t.Fatalf("%q: the waiter: %v", key, err)
		}
		if st, err := a.Inspect(ctx); err != nil || st.Permits != 2 || st.Holders != 2 {
			t.Fatalf("%q: Inspect = %+v, %v", key, st, err)
		}
		if _, err := a.Break(ctx, d.Owner()); err != nil {
			t.Fatal(err)
		}
		waitDone(t, d.Done(), "the broken holder")
		d.Release()
		mustRelease(t, a)
		if n := c.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("%q outlives its holders", key)
		}
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		nodes[node.Options().Addr] = true

		r := l.NewLock(key, WithShared())
		w := l.NewLock(key)
		mustAcquire(t, r)
		if ok, err := w.Acquire(); ok || err != nil {
			t.Fatalf("%q: exclusive under a share: %v, %v", key, ok, err)
		}
		mustRelease(t, r)
		mustAcquire(t, w)
		mustRelease(t, w)

		// Fair: an exclusive holder's release hands the key to both
		// waiters for a share.
		fw, shares := l.NewLock(key, WithFairness()), []*RedisLock{l.NewLock(key, WithShared(), WithFairness()), l.NewLock(key, WithShared(), WithFairness())}
		mustAcquire(t, fw)
		for _, rl := range shares {
			go func() { got <- rl.AcquireWait(ctx) }()
		}
		waitFor(t, 10*time.Second, "two waiters for a share", func() bool {
			st, err := fw.Inspect(ctx)
			return err == nil && st.Waiters == 2
		})
		mustRelease(t, fw)
		for range shares {
			if err := <-got; err != nil {
				t.Fatalf("%q: a fair share: %v", key, err)
			}
		}
		if st, err := fw.Inspect(ctx); err != nil || !st.Shared || st.Holders != 2 {
			t.Fatalf("%q: Inspect after the handoff = %+v, %v", key, st, err)
		}
		mustRelease(t, shares[0])
		mustRelease(t, shares[1])
		if n := c.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("%q outlives its fair shares", key)
		}
	}
	if len(nodes) < 2 {
		t.Fatalf("all keys on %d node(s): the test did not cross slots", len(nodes))
	}
}

// TestSentinelSemaphoreFailover: holders of a semaphore through a failover
// client keep their permits across a SENTINEL FAILOVER to a replica in
// sync (their renewals go to the new primary), and the semaphore still
// admits no more than n.
func TestSentinelSemaphoreFailover(t *testing.T) {
	ctx := context.Background()
	primary := redisserver.Start(t)
	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port))
	sc, fc := watchedBySentinel(t, primary, replica)
	sem := func() *RedisLock {
		return NewRedisLock(FromGoRedis(fc), "jobs", WithPermits(2), WithExpiry(3*time.Second))
	}
	a, b := sem(), sem()
	mustAcquire(t, a)
	mustAcquire(t, b)
	if n, err := fc.Wait(ctx, 1, 5000).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT: %d replicas, %v", n, err)
	}
	failOver(t, sc, replica)
	until := a.Until()
	waitFor(t, 20*time.Second, "a renewal on the new primary", func() bool { return a.Until().After(until) || isClosed(a.Done()) })
	var violations int64
	if isClosed(a.Done()) || isClosed(b.Done()) {
		violations++
		t.Errorf("a holder lost its permit in a failover to a replica in sync: %v, %v", a.Err(), b.Err())
	}
	if ok, err := sem().Acquire(); ok || err != nil {
		violations++
		t.Errorf("a third holder of 2 after the failover: %v, %v", ok, err)
	}
	mustRelease(t, a)
	c := sem()
	mustAcquire(t, c)
	mustRelease(t, b)
	mustRelease(t, c)
	recordFault(t, faultRow{
		Case:      "26. semaphore: Sentinel failover to a replica in sync",
		Injection: "SENTINEL FAILOVER while 2 holders of 2 permits hold, through a failover client",
		Promise:   "the holders keep their permits (renewed on the new primary); no third holder",
		Runs:      1, Faults: 1, Violations: violations,
	})
}

// TestFaultPermitHolderProcesses: a holder of the only permit, in a
// process of its own, SIGSTOPped past its lease: the next holder gets the
// permit, and the stopped one learns its loss within a renewal interval
// of resuming (it has no fencing: what it writes then is the limit of
// process pauses, see docs/reliability.md). Then one SIGKILLed: the next
// holder gets the permit once the dead one's lease ends.
func TestFaultPermitHolderProcesses(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const lease = time.Second
	var runs, violations int64
	for i := 0; i < 2; i++ {
		key := fmt.Sprintf("paused-permit:%d", i)
		child, lines := startChild(t, "paused-holder", "REDIS_ADDR="+srv.Addr, "LOCK_KEY="+key, "LOCK_LEASE="+lease.String(), "LOCK_PERMITS=1")
		expectLine(t, lines, "acquired")
		must(t, child.Process.Signal(syscall.SIGSTOP))
		next := NewRedisLock(FromGoRedis(c), key, WithPermits(1))
		if err := next.AcquireWait(ctx); err != nil { // once the stopped holder's lease ended
			t.Fatalf("the next holder: %v", err)
		}
		must(t, child.Process.Signal(syscall.SIGCONT))
		f := expectLine(t, lines, "lost")
		afterResume, isLoss := parseInt(t, f[0]), f[1] == "true"
		runs++
		if afterResume > int64(lease/3/time.Millisecond) || !isLoss {
			violations++
			t.Errorf("run %d: Done %d ms after resuming, ErrLockLost %v", i, afterResume, isLoss)
		}
		if err := child.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
		if holders, err := next.Holders(ctx); err != nil || len(holders) != 1 || holders[0].Owner != next.Owner() {
			violations++
			t.Errorf("run %d: the resumed holder's release touched the next one's permit: %v, %v", i, holders, err)
		}
		mustRelease(t, next)

		key += ":killed"
		child, lines = startChild(t, "paused-holder", "REDIS_ADDR="+srv.Addr, "LOCK_KEY="+key, "LOCK_LEASE="+lease.String(), "LOCK_PERMITS=1")
		expectLine(t, lines, "acquired")
		must(t, child.Process.Kill())
		_ = child.Wait()
		next = NewRedisLock(FromGoRedis(c), key, WithPermits(1))
		if ok, err := next.Acquire(); ok || err != nil {
			t.Fatalf("the dead holder's permit free at once: %v, %v", ok, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*lease)
		err := next.AcquireWait(wctx)
		cancel()
		runs++
		if err != nil {
			violations++
			t.Errorf("run %d: the dead holder's permit never came back: %v", i, err)
			continue
		}
		mustRelease(t, next)
	}
	recordFault(t, faultRow{
		Case:      "27. semaphore: holder process SIGSTOPped past its lease, or SIGKILLed",
		Injection: "SIGSTOP the process holding the only permit until the next holder got it (lease 1 s), then SIGCONT; SIGKILL another",
		Promise:   "the next holder gets the permit once the dead or stopped holder's lease ends; the resumed holder learns its loss within a renewal interval, and its release leaves the next holder's permit",
		Runs:      runs, Faults: runs, Violations: violations,
	})
}

// TestFaultFairSharedReplyLost: the proxy drops the replies of fair shared
// locks' scripts after they ran, and the client retries: the attempts
// that queue two waiters for a share, the exclusive holder's release that
// hands both their shares, a share's release that leaves the other, and
// the last share's release that hands the key to an exclusive waiter.
// Each waiter is queued once and handed the key once, with a token above
// the one before; each release is a release; nothing is left.
func TestFaultFairSharedReplyLost(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	px := startProxy(t, srv.Addr)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: 3})
	t.Cleanup(func() { _ = c.Close() })
	fc := &faultCount{t: t}
	released := func(key string, rl *RedisLock) {
		px.dropReplies.Store(1)
		if ok, err := rl.Release(); !ok || err != nil {
			fc.violate("%s: Release after a lost reply = %v, %v", key, ok, err)
		}
		fc.runs++
	}
	drops0 := px.replyDrops.Load()
	for round := range 3 {
		key := fmt.Sprintf("fair-shared:lost-reply:%d", round)
		lock := func(opts ...Option) *RedisLock {
			return NewRedisLock(FromGoRedis(c), key, append(opts, WithFairness(), WithFencing(), WithExpiry(30*time.Second),
				WithPubSub(srv.Client(t)))...) // wake-ups past the proxy
		}
		x, s1, s2, x2 := lock(), lock(WithShared()), lock(WithShared()), lock()
		mustAcquire(t, x)
		got := make(chan error, 3)
		for i, rl := range []*RedisLock{s1, s2} {
			px.dropReplies.Store(2) // the first attempt's reply, and the queueing attempt's
			go func() { got <- rl.AcquireWait(ctx) }()
			waitQueued(t, admin, key, int64(i+1))
			waitFor(t, 10*time.Second, "both replies dropped", func() bool { return px.dropReplies.Load() <= 0 })
			fc.runs += 2
		}
		time.Sleep(20 * time.Millisecond) // any retry has run
		if n := fairQueueLen(t, admin, key); n != 2 {
			fc.violate("%s: %d entries queued for two waiters", key, n)
		}
		released(key, x)
		for range 2 {
			if err := <-got; err != nil {
				fc.violate("%s: a waiter for a share: %v", key, err)
			}
		}
		if n := admin.ZCount(ctx, relatedName(key, "holders"), "(0", "(1e14").Val(); n != 2 || s1.Token() <= x.Token() || s2.Token() <= x.Token() || s1.Token() == s2.Token() {
			fc.violate("%s: %d shares after the handoff, tokens %d and %d after %d", key, n, s1.Token(), s2.Token(), x.Token())
		}
		released(key, s1)
		if n := admin.ZCount(ctx, relatedName(key, "holders"), "(0", "(1e14").Val(); n != 1 || isClosed(s2.Done()) {
			fc.violate("%s: %d shares after one of two was released; the other's Err: %v", key, n, s2.Err())
		}
		go func() { got <- x2.AcquireWait(ctx) }()
		waitQueued(t, admin, key, 1)
		released(key, s2)
		if err := <-got; err != nil {
			fc.violate("%s: the exclusive waiter: %v", key, err)
		}
		if v := admin.Get(ctx, key).Val(); v != holderID(x2) || x2.Token() <= max(s1.Token(), s2.Token()) {
			fc.violate("%s: key holds %q after the last share's release, token %d", key, v, x2.Token())
		}
		released(key, x2)
		waitKeysGone(t, admin, key, time.Second)
		if admin.Exists(ctx, key).Val() != 0 || fairQueueLen(t, admin, key) != 0 {
			fc.violate("%s: the key or its queue is left after the last release", key)
		}
	}
	recordFault(t, faultRow{
		Case:      "29. fair shared: reply lost after the script ran",
		Injection: "the proxy closes the connection instead of forwarding the reply of the attempts that queue two waiters for a share, of the exclusive holder's release that hands both their shares, of a share's release, and of the last share's release that hands the key to an exclusive waiter (go-redis retries)",
		Promise:   "each waiter is queued once and handed the key once, with a token above the one before; each release is a release, not a loss; nothing is left",
		Runs:      fc.runs, Faults: px.replyDrops.Load() - drops0, Violations: fc.violations,
	})
}
