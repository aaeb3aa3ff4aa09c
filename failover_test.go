package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// sentinelSet is a primary and its replicas, watched by one Sentinel.
// Each server is reached through two proxies: the one it announces
// (repl), through which replication and the Sentinel go, and the one lock
// clients dial in its place (front). Holding a server's repl cuts it off
// from its replicas and the Sentinel while its clients still reach it:
// the partition that lets a Sentinel promote a replica that lags.
type sentinelSet struct {
	servers  []*redisserver.Server
	repl     []*faultProxy
	front    []*faultProxy
	sentinel *redisserver.Server
	sc       *redis.SentinelClient
}

// startSentinelSet starts a primary and replicas replicas, server i with
// args(i) if args is not nil, and a Sentinel (quorum 1, down after 1 s)
// with conf, and waits until the Sentinel knows every replica.
func startSentinelSet(t *testing.T, replicas int, args func(i int) []string, conf ...string) *sentinelSet {
	t.Helper()
	ctx := context.Background()
	set := &sentinelSet{}
	for i := 0; i <= replicas; i++ {
		var more []string
		if args != nil {
			more = args(i)
		}
		srv := redisserver.Start(t, more...)
		repl, front := startProxy(t, srv.Addr), startProxy(t, srv.Addr)
		set.servers, set.repl, set.front = append(set.servers, srv), append(set.repl, repl), append(set.front, front)
		set.announce(t, i)
		c := srv.Client(t)
		if i > 0 {
			_, primary, _ := strings.Cut(set.repl[0].Addr(), ":")
			must(t, c.Do(ctx, "REPLICAOF", "127.0.0.1", primary).Err())
		}
	}
	set.waitOnline(t, 0, replicas)
	set.sentinel = redisserver.StartSentinel(t, "mymaster", set.repl[0].Addr(), conf...)
	set.sc = redis.NewSentinelClient(&redis.Options{Addr: set.sentinel.Addr})
	t.Cleanup(func() { _ = set.sc.Close() })
	waitFor(t, 30*time.Second, "the Sentinel to know the replicas", func() bool {
		known, _ := set.sc.Replicas(ctx, "mymaster").Result()
		return len(known) == replicas
	})
	return set
}

// announce has server i announce its repl proxy's address to its
// primary, from which the Sentinel learns it.
func (set *sentinelSet) announce(t *testing.T, i int) {
	t.Helper()
	ctx := context.Background()
	_, port, _ := strings.Cut(set.repl[i].Addr(), ":")
	c := redis.NewClient(&redis.Options{Addr: set.servers[i].Addr})
	defer c.Close()
	must(t, c.ConfigSet(ctx, "replica-announce-ip", "127.0.0.1").Err())
	must(t, c.ConfigSet(ctx, "replica-announce-port", port).Err())
}

// restart kills server i and starts it again, as a primary of what it
// persisted, announcing its address again.
func (set *sentinelSet) restart(t *testing.T, i int) {
	t.Helper()
	set.servers[i].Restart(t)
	set.announce(t, i)
}

// waitOnline waits until server i, a primary, counts n replicas online.
func (set *sentinelSet) waitOnline(t *testing.T, i, n int) {
	t.Helper()
	set.servers[i].WaitReplicas(t, n)
}

// dial dials a server's front proxy for its announced address.
func (set *sentinelSet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	for i, p := range set.repl {
		if p.Addr() == addr {
			addr = set.front[i].Addr()
		}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// client returns a failover client of the set, closed with t.
func (set *sentinelSet) client(t *testing.T) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{set.sentinel.Addr},
		Dialer: set.dial, MaxRetries: 3})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// primary returns the index of the server the Sentinel reports as the
// primary, or -1.
func (set *sentinelSet) primary() int {
	addr, err := set.sc.GetMasterAddrByName(context.Background(), "mymaster").Result()
	if err != nil || len(addr) != 2 {
		return -1
	}
	for i, p := range set.repl {
		if p.Addr() == addr[0]+":"+addr[1] {
			return i
		}
	}
	return -1
}

// promoted waits until the Sentinel reports a primary other than was,
// and that server says it is one, and returns it.
func (set *sentinelSet) promoted(t *testing.T, was int) int {
	t.Helper()
	now := -1
	waitFor(t, 30*time.Second, "a failover", func() bool {
		now = set.primary()
		return now >= 0 && now != was &&
			strings.Contains(set.servers[now].Client(t).Info(context.Background(), "replication").Val(), "role:master")
	})
	return now
}

// rejoin makes server i, a primary that was cut off or restarted, a
// replica of server r, as the Sentinel does once it notices (within its
// 10 s INFO period), and waits until r counts it online.
func (set *sentinelSet) rejoin(t *testing.T, i, r int) {
	t.Helper()
	_, port, _ := strings.Cut(set.repl[r].Addr(), ":")
	must(t, set.servers[i].Client(t).Do(context.Background(), "REPLICAOF", "127.0.0.1", port).Err())
	set.waitOnline(t, r, 1)
}

// failOver has the Sentinel promote a replica, and returns it.
func (set *sentinelSet) failOver(t *testing.T) int {
	t.Helper()
	was := set.primary()
	waitFor(t, 30*time.Second, "SENTINEL FAILOVER", func() bool { // INPROG while one ends
		return set.sc.Failover(context.Background(), "mymaster").Err() == nil
	})
	return set.promoted(t, was)
}

// believes reports whether rl believes it holds its lock now.
func believes(rl *RedisLock) bool {
	return !isClosed(rl.Done()) && time.Now().Before(rl.Until())
}

// TestFailoverWithAndWithoutReplicas measures what a Sentinel failover
// does to a lock that A holds when a replica is promoted, with and
// without WithReplicas(1), in the cases docs/reliability.md lists. After
// each failover B takes the lock on the new primary (waiting as long as
// it must); "two holders" counts the runs in which A still believed it
// held (Done open, Until ahead) when B got it. WithReplicas(1) promises
// none where the promoted replica acknowledged A's writes; the other rows
// are measured, not promised.
func TestFailoverWithAndWithoutReplicas(t *testing.T) {
	type outcome struct{ runs, twoHolders, kept int }
	ctx := context.Background()
	const lease = 3 * time.Second
	// bTakes has B wait for the lock A held on the new primary. If B has
	// not got it within two of A's leases while A still holds, A kept its
	// lock across the failover; it releases it then.
	bTakes := func(t *testing.T, set *sentinelSet, o *outcome, a *RedisLock, opts ...Option) *RedisLock {
		b := NewRedisLock(FromGoRedis(set.client(t)), a.Key(), append(opts, WithExpiry(lease))...)
		got := make(chan error, 1)
		go func() {
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
				// READONLY, too few replicas: the set is still settling.
				if err := b.AcquireWait(ctx); err == nil || time.Now().After(deadline) {
					got <- err
					return
				}
			}
		}()
		o.runs++
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("B: %v", err)
			}
			if believes(a) {
				o.twoHolders++
			}
			return b
		case <-time.After(2 * lease):
		}
		if !believes(a) {
			t.Fatalf("B waits, and A does not hold: %v", a.Err())
		}
		o.kept++
		mustRelease(t, a)
		if err := <-got; err != nil {
			t.Fatalf("B after A's release: %v", err)
		}
		return b
	}
	row := func(t *testing.T, name, injection, promise string, o outcome, promised bool) {
		var violations int64
		if promised {
			violations = int64(o.twoHolders)
		}
		recordFault(t, faultRow{Case: name, Injection: injection,
			Promise: fmt.Sprintf("%s (two holders in %d of %d runs; A kept its lock in %d)", promise, o.twoHolders, o.runs, o.kept),
			Runs:    int64(o.runs), Faults: int64(o.runs), Violations: violations})
	}

	// The promoted replica lags: the primary is cut off from it and from
	// the Sentinel (its clients still reach it), and SENTINEL FAILOVER
	// promotes the replica.
	t.Run("lagging replica", func(t *testing.T) {
		for _, n := range []int{0, 1} {
			var o outcome
			for run := range 2 {
				set := startSentinelSet(t, 1, nil) // one failover each: a Sentinel is slow to find a rejoined replica fit
				key := fmt.Sprintf("lagging:%d:%d", n, run)
				a := NewRedisLock(FromGoRedis(set.client(t)), key, WithReplicas(n), WithExpiry(lease), WithFencing())
				if n > 0 {
					mustAcquire(t, a) // acknowledged, before the cut
				}
				p := set.primary()
				set.repl[p].hold()
				if n == 0 {
					mustAcquire(t, a) // on the primary alone
				} else if ok, err := NewRedisLock(FromGoRedis(set.client(t)), key+":cut", WithReplicas(n)).Acquire(); ok || !errors.Is(err, ErrNotReplicated) {
					t.Fatalf("an acquisition on the cut-off primary: %v, %v", ok, err)
				}
				r := set.failOver(t)
				if n > 0 { // WithReplicas(1) needs the new primary's replica: the old one, back
					set.repl[p].release()
					set.rejoin(t, p, r)
				}
				b := bTakes(t, set, &o, a, WithReplicas(n), WithFencing())
				if b.Token() <= a.Token() {
					t.Errorf("B's token %d is not above A's %d", b.Token(), a.Token())
				}
				a.Release()
				mustRelease(t, b)
			}
			if n == 0 {
				row(t, "30. Sentinel failover to a replica that lags, without WithReplicas", "the primary cut off from its replica and the Sentinel (its clients still reach it), A acquires, SENTINEL FAILOVER",
					"not promised: the new primary lacks A's key, and B takes it while A believes it holds", o, false)
			} else {
				row(t, "30b. Sentinel failover to a replica that lags, WithReplicas(1)", "as case 30, A's lock taken before the cut; an acquisition during the cut",
					"the cut-off primary reports no acquisition (ErrNotReplicated); A's renewals fail, and its lease ends it before B gets the key on the new primary: never two holders", o, true)
			}
		}
	})

	// Two replicas, WithReplicas(1): the one that acknowledged A's
	// acquisition is promoted, as the Sentinel prefers the replica with
	// the most data; unless it died before the failover.
	t.Run("two replicas", func(t *testing.T) {
		for _, ackedDies := range []bool{false, true} {
			set := startSentinelSet(t, 2, nil)
			// Replica 2 replicates through a link of its own, which then
			// stalls: replica 1 alone acknowledges A's acquisition.
			lag := startProxy(t, set.servers[0].Addr)
			_, port, _ := strings.Cut(lag.Addr(), ":")
			must(t, set.servers[2].Client(t).Do(ctx, "REPLICAOF", "127.0.0.1", port).Err())
			set.waitOnline(t, 0, 2)
			lag.hold()
			a := NewRedisLock(FromGoRedis(set.client(t)), "two", WithReplicas(1), WithExpiry(lease), WithFencing())
			mustAcquire(t, a)
			set.servers[0].Stop() // the primary dies
			if ackedDies {
				set.servers[1].Stop()
			}
			r := set.promoted(t, 0)
			var o outcome
			b := bTakes(t, set, &o, a, WithFencing()) // no replicas left to wait for, when replica 1 died
			if ackedDies {
				row(t, "31b. Sentinel failover after the replica that acknowledged died, WithReplicas(1) of 2", "replica 2's link stalled while replica 1 acknowledges A's acquisition; the primary, then replica 1, killed; replica 2 promoted",
					fmt.Sprintf("not promised (promoted: replica %d): the replica promoted never had A's key", r), o, false)
			} else {
				if r != 1 {
					t.Errorf("the Sentinel promoted replica %d, not the one that acknowledged", r)
				}
				row(t, "31. Sentinel failover with a replica that acknowledged and one that lags, WithReplicas(1) of 2", "replica 2's link stalled while replica 1 acknowledges A's acquisition; the primary killed",
					fmt.Sprintf("the Sentinel promotes the replica with the most data (replica %d), which has A's key, and A keeps its lock: never two holders", r), o, true)
			}
			a.Release()
			mustRelease(t, b)
		}
	})

	// A primary that restarts before the Sentinel notices comes back with
	// what it persisted, and its replica resyncs from it: WAIT does not
	// help without persistence; appendonly with fsync always keeps the key.
	t.Run("primary restarts", func(t *testing.T) {
		for _, persist := range []bool{false, true} {
			args := func(i int) []string {
				if persist && i == 0 { // the primary's alone
					return []string{"--appendonly", "yes", "--appendfsync", "always"}
				}
				return nil
			}
			set := startSentinelSet(t, 1, args)
			a := NewRedisLock(FromGoRedis(set.client(t)), "restart", WithReplicas(1), WithExpiry(lease), WithFencing())
			mustAcquire(t, a)
			set.restart(t, 0)
			set.waitOnline(t, 0, 1)
			var o outcome
			b := bTakes(t, set, &o, a, WithReplicas(1), WithFencing())
			if persist {
				row(t, "32b. primary restarted with appendonly and fsync always, WithReplicas(1)", "kill -9 and restart of the primary before the Sentinel notices",
					"the key survives, and A keeps its lock: never two holders", o, true)
			} else {
				row(t, "32. primary restarted without persistence, WithReplicas(1)", "kill -9 and restart of the primary before the Sentinel notices; its replica resyncs from it",
					"not promised: the key is gone from both, and B takes it while A believes it holds", o, false)
			}
			a.Release()
			mustRelease(t, b)
		}
	})
}
