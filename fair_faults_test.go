package redislock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock/internal/redisserver"
)

// Fair locks under faults: waiters in processes of their own (the test
// binary run again as a "fair-waiter" child) or on clients of their own,
// each critical section a fenced read-modify-write recorded for the
// history checker.

// fencedSection runs one critical section of client under rl's hold: it
// reads the counter of rl's resource and writes it back incremented,
// fenced with rl's token, and returns the operation.
func fencedSection(ctx context.Context, c *redis.Client, rl *RedisLock, client int) (fencedOp, error) {
	resource := rl.Key() + ":resource"
	op := fencedOp{Key: rl.Key(), Client: client, Token: rl.Token(), Call: time.Now().UnixNano()}
	n, err := c.HGet(ctx, resource, "count").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return op, err
	}
	ok, err := hammerWrite.Run(ctx, c, []string{resource}, op.Token, n+1).Int()
	op.Read, op.Accepted, op.Return = n, ok == 1, time.Now().UnixNano()
	return op, err
}

// sections collects the critical sections of a test.
type sections struct {
	mu  sync.Mutex
	ops []fencedOp
}

func (s *sections) add(op fencedOp) {
	s.mu.Lock()
	s.ops = append(s.ops, op)
	s.mu.Unlock()
}

// addFile adds the sections a child wrote to path.
func (s *sections) addFile(t *testing.T, path string) {
	t.Helper()
	ops, err := readOps(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.ops = append(s.ops, ops...)
	s.mu.Unlock()
}

// unlinearizable checks the history, reporting the offending operations;
// it returns 1 when it is not linearizable, else 0.
func (s *sections) unlinearizable(t *testing.T) int64 {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if report := checkHistory(s.ops, time.Minute); report != "" {
		t.Error(report)
		return 1
	}
	return 0
}

// byCall returns the clients of the sections in the order they began.
func (s *sections) byCall() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	ops := append([]fencedOp(nil), s.ops...)
	sort.Slice(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	clients := make([]int, len(ops))
	for i, op := range ops {
		clients[i] = op.Client
	}
	return clients
}

// fairWaiterChild waits for the fair lock LOCK_KEY with lease LOCK_LEASE as
// client FAIR_CLIENT, and reports "waiting" before and "acquired" after.
// With FAIR_MODE=die it kills itself at once, holding the lock; otherwise
// it runs one critical section, writes it to HISTORY, and releases.
func fairWaiterChild(out io.Writer) error {
	lease, err := time.ParseDuration(os.Getenv("LOCK_LEASE"))
	if err != nil {
		return err
	}
	client, _ := strconv.Atoi(os.Getenv("FAIR_CLIENT"))
	c := redis.NewClient(&redis.Options{Addr: os.Getenv("REDIS_ADDR")})
	defer c.Close()
	ctx := context.Background()
	rl := NewRedisLock(FromGoRedis(c), os.Getenv("LOCK_KEY"), WithFairness(), WithFencing(), WithExpiry(lease))
	fmt.Fprintln(out, "waiting")
	if err := rl.AcquireWait(ctx); err != nil {
		return err
	}
	if os.Getenv("FAIR_MODE") == "die" {
		fmt.Fprintln(out, "acquired", time.Now().UnixNano())
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	op, err := fencedSection(ctx, c, rl, client)
	if err != nil {
		return err
	}
	if err := writeOps(os.Getenv("HISTORY"), []fencedOp{op}); err != nil {
		return err
	}
	fmt.Fprintln(out, "acquired", time.Now().UnixNano())
	if ok, err := rl.Release(); !ok || err != nil {
		return fmt.Errorf("release: %v %v", ok, err)
	}
	return nil
}

// fairChild is a fair-waiter child.
type fairChild struct {
	cmd     *exec.Cmd
	lines   *bufio.Scanner
	history string
}

// startFairWaiter starts a fair-waiter child as client on key, and waits
// until it is queued: the queue then holds queued waiters.
func startFairWaiter(t *testing.T, srv *redisserver.Server, admin *redis.Client, key string, lease time.Duration, client int, queued int64, mode string) fairChild {
	t.Helper()
	history := filepath.Join(t.TempDir(), "history")
	cmd, lines := startChild(t, "fair-waiter", "REDIS_ADDR="+srv.Addr, "LOCK_KEY="+key, "LOCK_LEASE="+lease.String(),
		fmt.Sprintf("FAIR_CLIENT=%d", client), "FAIR_MODE="+mode, "HISTORY="+history)
	expectLine(t, lines, "waiting")
	waitQueued(t, admin, key, queued)
	return fairChild{cmd, lines, history}
}

// acquiredAt reads the child's "acquired" line: when it acquired.
func (ch fairChild) acquiredAt(t *testing.T) time.Time {
	t.Helper()
	f := expectLine(t, ch.lines, "acquired")
	return time.Unix(0, parseInt(t, f[0]))
}

// TestFairOrderAcrossProcesses: waiters in processes of their own, queued
// in a known order, acquire in that order, and their sections form a
// linearizable history.
func TestFairOrderAcrossProcesses(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	key, lease := "fair:processes", 2*time.Second
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithFencing(), WithExpiry(lease))
	mustAcquire(t, holder)
	var all sections
	op, err := fencedSection(context.Background(), admin, holder, 0)
	if err != nil {
		t.Fatal(err)
	}
	all.add(op)
	const n = 4
	var children []fairChild
	for i := 1; i <= n; i++ {
		children = append(children, startFairWaiter(t, srv, admin, key, lease, i, int64(i), ""))
	}
	mustRelease(t, holder)
	for _, ch := range children {
		ch.acquiredAt(t)
		if err := ch.cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
		all.addFile(t, ch.history)
	}
	want := []int{0, 1, 2, 3, 4}
	if got := all.byCall(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sections in order %v, want %v", got, want)
	}
	all.unlinearizable(t)
}

// TestFaultFairWaiterKilled: a waiting process SIGKILLed at the head of the
// queue costs the next waiter at most about one lease after the release:
// at once when it had lapsed before the release (the handoff skips it),
// one lease when the release handed it the lock just after it died; and
// a process SIGKILLed just after it was handed the lock holds it one lease,
// like a crashed holder. Every section is recorded for the history check.
func TestFaultFairWaiterKilled(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const lease = time.Second
	var runs, faults, violations int64
	for _, tc := range []struct {
		name      string
		mode      string        // the first waiter's: "" waits to be killed, "die" kills itself once handed the lock
		lapse     time.Duration // how long after the kill the holder releases
		within    time.Duration // the next waiter acquires within this of the release
		handedOff bool          // the release handed the lock to the first waiter
	}{
		{"killed while queued, lapsed before the release", "", lease + lease/2, lease / 2, false},
		{"killed while queued, just before the release", "", 0, 2 * lease, true},
		{"killed just after it was handed the lock", "die", 0, 2 * lease, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "fair:killed:" + strconv.Itoa(int(runs))
			runs++
			var all sections
			holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithFencing(), WithExpiry(lease))
			mustAcquire(t, holder)
			first := startFairWaiter(t, srv, admin, key, lease, 1, 1, tc.mode)
			next := startFairWaiter(t, srv, admin, key, lease, 2, 2, "")
			if tc.mode == "" {
				_ = first.cmd.Process.Kill()
				_ = first.cmd.Wait()
				time.Sleep(tc.lapse)
			}
			faults++
			released := time.Now()
			mustRelease(t, holder)
			if tc.mode == "die" {
				first.acquiredAt(t)
				_ = first.cmd.Wait()
			}
			got := next.acquiredAt(t)
			if err := next.cmd.Wait(); err != nil {
				t.Fatalf("next waiter: %v", err)
			}
			all.addFile(t, next.history)
			waited := got.Sub(released)
			t.Logf("the next waiter acquired %v after the release", waited.Round(time.Millisecond))
			if waited > tc.within {
				violations++
				t.Errorf("the next waiter acquired %v after the release, want within %v", waited, tc.within)
			}
			if handedOff := waited > lease/2; handedOff != tc.handedOff { // the case's premise
				t.Errorf("handed to the dead waiter: %v, expected %v", handedOff, tc.handedOff)
			}
			violations += all.unlinearizable(t)
			waitKeysGone(t, admin, key, 3*lease)
		})
	}
	recordFault(t, faultRow{
		Case: "12. fair: waiter SIGKILLed", Injection: "SIGKILL of the waiting process at the head of the queue (lapsed or not), or just after it was handed the lock; lease 1s",
		Promise: "the next waiter acquires within one lease of the release (at once if the dead one lapsed); history linearizable; queue keys gone",
		Runs:    runs, Faults: faults, Violations: violations,
	})
}

// waitKeysGone waits (within d) until nothing but the lock's fencing
// counter and its resource is left of key's: no queue, no liveness key.
func waitKeysGone(t *testing.T, admin *redis.Client, key string, d time.Duration) {
	t.Helper()
	var left []string
	for end := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		left = left[:0]
		for _, k := range admin.Keys(context.Background(), "*"+key+"*").Val() {
			if k != relatedName(key, "fence") && k != key+":resource" && k != relatedName(key, "releases") && k != relatedName(key, "abandoned") &&
				k != relatedName(key, "broken") {
				left = append(left, k)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Errorf("left behind after %v: %v", d, left)
			return
		}
	}
}

// TestFaultFairContextEndsAtHandoff: a waiter's context ends as the lock
// is handed to it (a subscriber of the test cancels it when it hears the
// handoff, racing the waiter's own subscription). Either the waiter has the
// lock (AcquireWait returned nil and it holds), or it gave up with
// ErrNotAcquired and passed the lock on at once: the next waiter never
// waits out a lease, and no section overlaps another.
func TestFaultFairContextEndsAtHandoff(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const lease = 3 * time.Second
	var runs, faults, violations, tookIt int64
	var all sections
	for i := 0; i < 20; i++ {
		key := "fair:cancelled"
		runs++
		holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithFencing(), WithExpiry(lease))
		mustAcquire(t, holder)
		wc := srv.Client(t)
		waiter := NewRedisLock(FromGoRedis(wc), key, WithFairness(), WithFencing(), WithExpiry(lease))
		ctx, cancel := context.WithCancel(context.Background())
		ps := admin.Subscribe(context.Background(), relatedName(key, "released"))
		if _, err := ps.Receive(context.Background()); err != nil {
			t.Fatal(err)
		}
		go func() {
			if _, err := ps.ReceiveMessage(context.Background()); err == nil {
				time.Sleep(time.Duration(i%5) * 50 * time.Microsecond) // spread the moment
				cancel()
			}
		}()
		waited := make(chan error, 1)
		go func() { waited <- waiter.AcquireWait(ctx) }()
		waitQueued(t, admin, key, 1)
		nc := srv.Client(t)
		next := NewRedisLock(FromGoRedis(nc), key, WithFairness(), WithFencing(), WithExpiry(lease))
		nextDone := make(chan error, 1)
		go func() { nextDone <- next.AcquireWait(context.Background()) }()
		waitQueued(t, admin, key, 2)

		faults++
		released := time.Now()
		mustRelease(t, holder)
		err := <-waited
		switch {
		case err == nil:
			tookIt++
			if waiter.Holds() != 1 {
				violations++
				t.Errorf("run %d: AcquireWait returned nil without the lock", i)
			}
			op, err := fencedSection(context.Background(), wc, waiter, 1)
			if err != nil {
				t.Fatal(err)
			}
			all.add(op)
			mustRelease(t, waiter)
		case !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.Canceled):
			violations++
			t.Errorf("run %d: AcquireWait: %v, want ErrNotAcquired and context.Canceled", i, err)
		}
		if err := <-nextDone; err != nil {
			t.Fatal(err)
		}
		if d := time.Since(released); d > lease/2 {
			violations++
			t.Errorf("run %d: the next waiter acquired %v after the release: the lock was not passed on", i, d)
		}
		op, err := fencedSection(context.Background(), nc, next, 2)
		if err != nil {
			t.Fatal(err)
		}
		all.add(op)
		mustRelease(t, next)
		_ = ps.Close()
		cancel()
	}
	t.Logf("the waiter kept the lock in %d of %d runs, passed it on in the others", tookIt, runs)
	violations += all.unlinearizable(t)
	waitGiveBacks()
	waitKeysGone(t, admin, "fair:cancelled", 3*lease)
	recordFault(t, faultRow{
		Case: "13. fair: context ends at the handoff", Injection: "the waiter's context cancelled when the handoff is published",
		Promise: "AcquireWait holds the lock or returns ErrNotAcquired and passes it on at once; history linearizable",
		Runs:    runs, Faults: faults, Violations: violations,
	})
}

// TestFaultFairRestartWithWaitersQueued: redis-server killed and restarted
// (no persistence) while waiters are queued and the lock held: the holder
// learns its loss, the waiters find the queue gone and queue again, and
// every one of them acquires; no section overlaps another.
func TestFaultFairRestartWithWaitersQueued(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const lease, n = time.Second, 6
	var runs, violations int64
	for run := 0; run < 3; run++ {
		key := fmt.Sprintf("fair:restart:%d", run)
		var all sections
		holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithFencing(), WithExpiry(lease))
		mustAcquire(t, holder)
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 1; i <= n; i++ {
			c := srv.Client(t)
			rl := NewRedisLock(FromGoRedis(c), key, WithFairness(), WithFencing(), WithExpiry(lease))
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				if err := rl.AcquireWait(ctx); err != nil {
					errs <- fmt.Errorf("waiter %d: %w", i, err)
					return
				}
				op, err := fencedSection(context.Background(), c, rl, i)
				if err != nil {
					errs <- err
				}
				all.add(op)
				if _, err := rl.Release(); err != nil {
					errs <- fmt.Errorf("waiter %d release: %w", i, err)
				}
			}()
			waitQueued(t, admin, key, int64(i))
		}
		runs++
		srv.Restart(t)
		select {
		case <-holder.Done():
		case <-time.After(10 * time.Second):
			violations++
			t.Error("the holder did not learn that the restart erased its key")
		}
		if !errors.Is(holder.Err(), ErrLockLost) {
			violations++
			t.Errorf("the holder's hold ended with %v, want ErrLockLost", holder.Err())
		}
		holder.Release()
		wg.Wait()
		close(errs)
		for err := range errs {
			violations++
			t.Error(err)
		}
		violations += all.unlinearizable(t)
		if all.len() != n {
			violations++
			t.Errorf("%d of %d waiters acquired", all.len(), n)
		}
		waitKeysGone(t, admin, key, 3*lease)
	}
	recordFault(t, faultRow{
		Case: "14. fair: restart with waiters queued", Injection: "kill -9 and restart redis-server (no persistence) with 6 waiters queued, lease 1s",
		Promise: "the holder learns its loss; every waiter acquires; history linearizable; queue keys gone",
		Runs:    runs, Faults: runs, Violations: violations,
	})
}

// TestFaultFairPubSubKilled: the waiters' pub/sub connections are killed
// (CLIENT KILL TYPE pubsub) while they are queued, before each release:
// the waiters still acquire, in their order, learning of the handoff from
// the resubscription or their next attempt (at most lease/3 away).
func TestFaultFairPubSubKilled(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	const lease, n = time.Second, 4
	key := "fair:pubsub"
	var all sections
	var faults, violations int64
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithFencing(), WithExpiry(lease))
	mustAcquire(t, holder)
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i := 1; i <= n; i++ {
		c := srv.Client(t)
		rl := NewRedisLock(FromGoRedis(c), key, WithFairness(), WithFencing(), WithExpiry(lease))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := rl.AcquireWait(context.Background()); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			op, err := fencedSection(context.Background(), c, rl, i)
			if err != nil {
				t.Error(err)
			}
			all.add(op)
			<-release // the test kills the subscriptions before each release
			if _, err := rl.Release(); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		}()
		waitQueued(t, admin, key, int64(i))
	}
	for i := 0; i < n; i++ {
		if err := admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		faults++
		if i == 0 {
			mustRelease(t, holder)
		} else {
			release <- struct{}{}
		}
		for end := time.Now().Add(5 * time.Second); int(all.len()) < i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%d waiters acquired after %d releases", all.len(), i+1)
			}
		}
	}
	release <- struct{}{}
	wg.Wait()
	if got := all.byCall(); fmt.Sprint(got) != fmt.Sprint([]int{1, 2, 3, 4}) {
		violations++
		t.Errorf("acquired in order %v, want 1..4", got)
	}
	violations += all.unlinearizable(t)
	recordFault(t, faultRow{
		Case: "15. fair: pub/sub killed while waiting", Injection: "CLIENT KILL TYPE pubsub before each of 4 releases, lease 1s",
		Promise: "every waiter acquires, in arrival order, within a third of its lease; history linearizable",
		Runs:    n, Faults: faults, Violations: violations,
	})
}

func (s *sections) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ops)
}

// TestFaultFairGoZeroBarges: go-zero's own RedisLock contends with fair
// waiters on one key, retrying every millisecond as its users do. Mutual
// exclusion holds for all (go-zero's sections take a token from the fencing
// counter under its lock); the fair waiters all finish; and after each of
// go-zero's releases, which publish nothing, the next section begins within
// go-zero's lease.
func TestFaultFairGoZeroBarges(t *testing.T) {
	srv := redisserver.Start(t)
	const fairWaiters, rounds, zeroRounds = 3, 15, 10
	key := "fair:gozero"
	var all sections
	var wg sync.WaitGroup
	for i := 1; i <= fairWaiters; i++ {
		c := srv.Client(t)
		rl := NewRedisLock(FromGoRedis(c), key, WithFairness(), WithFencing(), WithExpiry(time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				if err := rl.AcquireWait(context.Background()); err != nil {
					t.Errorf("fair waiter %d: %v", i, err)
					return
				}
				op, err := fencedSection(context.Background(), c, rl, i)
				if err != nil {
					t.Error(err)
				}
				all.add(op)
				time.Sleep(time.Millisecond)
				if _, err := rl.Release(); err != nil {
					t.Errorf("fair waiter %d release: %v", i, err)
				}
			}
		}()
	}
	zc := srv.Client(t)
	zero := zredis.NewRedisLock(goZeroStore(t, srv.Addr), key)
	zero.SetExpire(1) // 1.5s
	var zeroReleases []int64
	for r := 0; r < zeroRounds; r++ {
		for {
			ok, err := zero.Acquire()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				break
			}
			time.Sleep(time.Millisecond)
		}
		token, err := zc.Incr(context.Background(), relatedName(key, "fence")).Result()
		if err != nil {
			t.Fatal(err)
		}
		op := fencedOp{Key: key, Client: 0, Token: token, Call: time.Now().UnixNano()}
		n, err := zc.HGet(context.Background(), key+":resource", "count").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		accepted, err := hammerWrite.Run(context.Background(), zc, []string{key + ":resource"}, token, n+1).Int()
		if err != nil {
			t.Fatal(err)
		}
		op.Read, op.Accepted, op.Return = n, accepted == 1, time.Now().UnixNano()
		all.add(op)
		time.Sleep(5 * time.Millisecond)
		zeroReleases = append(zeroReleases, time.Now().UnixNano())
		if ok, err := zero.Release(); !ok || err != nil {
			t.Fatalf("go-zero release: %v %v", ok, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	var violations int64
	if got := all.len(); got != fairWaiters*rounds+zeroRounds {
		violations++
		t.Errorf("%d sections, want %d", got, fairWaiters*rounds+zeroRounds)
	}
	all.mu.Lock()
	var longest time.Duration
	for _, released := range zeroReleases {
		next := int64(0)
		for _, op := range all.ops {
			if op.Call > released && (next == 0 || op.Call < next) {
				next = op.Call
			}
		}
		if next != 0 {
			longest = max(longest, time.Duration(next-released))
		}
	}
	all.mu.Unlock()
	t.Logf("longest gap after a go-zero release: %v", longest.Round(time.Millisecond))
	if longest > 1500*time.Millisecond+500*time.Millisecond {
		violations++
		t.Errorf("a fair waiter took %v to take the key after go-zero's release, beyond go-zero's 1.5s lease", longest)
	}
	violations += all.unlinearizable(t)
	recordFault(t, faultRow{
		Case: "16. fair: go-zero barges in", Injection: "go-zero's RedisLock (1ms retries) against 3 fair waiters on one key",
		Promise: "mutual exclusion for all (history linearizable); every fair waiter finishes; after go-zero's release a fair waiter takes the key within go-zero's lease",
		Runs:    int64(all.len()), Faults: zeroRounds, Violations: violations,
	})
}

// TestFaultFairReplyLost: the proxy drops the reply of a fair lock's
// acquisition, of the attempts that queue a waiter, and of the release that
// hands the lock on; the clients retry (MaxRetries 3). The acquisition has
// the lock, the waiter is queued once, the release is a release (not a
// loss) that handed the lock to the waiter once, and nothing is left.
func TestFaultFairReplyLost(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	px := startProxy(t, srv.Addr)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: 3})
	t.Cleanup(func() { _ = c.Close() })
	fc := &faultCount{t: t}
	drops0 := px.replyDrops.Load()
	for round := range 5 {
		key := fmt.Sprintf("fair:lost-reply:%d", round)
		holder := NewRedisLock(FromGoRedis(c), key, WithFairness(), WithFencing(), WithExpiry(30*time.Second))
		waiter := NewRedisLock(FromGoRedis(c), key, WithFairness(), WithFencing(), WithExpiry(30*time.Second),
			WithPubSub(srv.Client(t))) // wake-ups past the proxy
		px.dropReplies.Store(1)
		if ok, err := holder.Acquire(); !ok || err != nil {
			fc.violate("%s: Acquire on a free lock after a lost reply = %v, %v", key, ok, err)
		}
		fc.runs++
		if v := admin.Get(ctx, key).Val(); v != holderID(holder) {
			fc.violate("%s: key holds %q, not the holder's id", key, v)
		}
		px.dropReplies.Store(2) // the first attempt's reply, and the queueing attempt's
		got := make(chan error, 1)
		go func() { got <- waiter.AcquireWait(ctx) }()
		waitQueued(t, admin, key, 1)
		waitFor(t, 10*time.Second, "both replies dropped", func() bool { return px.dropReplies.Load() <= 0 })
		fc.runs += 2
		time.Sleep(20 * time.Millisecond) // any retry has run
		if n := fairQueueLen(t, admin, key); n != 1 {
			fc.violate("%s: %d entries queued for one waiter", key, n)
		}
		px.dropReplies.Store(1)
		if ok, err := holder.Release(); !ok || err != nil {
			fc.violate("%s: Release after a lost reply = %v, %v", key, ok, err)
		}
		fc.runs++
		if err := <-got; err != nil {
			fc.violate("%s: the waiter: %v", key, err)
		}
		if v := admin.Get(ctx, key).Val(); v != holderID(waiter) || waiter.Token() <= holder.Token() {
			fc.violate("%s: key holds %q after the handoff, token %d after %d", key, v, waiter.Token(), holder.Token())
		}
		if ok, err := waiter.Release(); !ok || err != nil {
			fc.violate("%s: the waiter's release = %v, %v", key, ok, err)
		}
		waitKeysGone(t, admin, key, time.Second)
		if admin.Exists(ctx, key).Val() != 0 {
			fc.violate("%s: the key is left after the last release", key)
		}
	}
	recordFault(t, faultRow{
		Case:      "17. fair: reply lost after the script ran",
		Injection: "the proxy closes the connection instead of forwarding the reply of a fair acquisition, of a waiter's attempts that queue it, or of the release that hands the lock on; go-redis retries",
		Promise:   "the acquisition has the lock; the waiter is queued once and handed the lock once; the release is a release, not a loss; nothing is left",
		Runs:      fc.runs, Faults: px.replyDrops.Load() - drops0, Violations: fc.violations,
	})
}
