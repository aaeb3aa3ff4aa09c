package redislock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// waitFor polls cond every 20ms for up to d, failing t with what.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
	}
}

func TestSentinelFailoverCanLoseLockAndFencingRefusesStaleHolder(t *testing.T) {
	ctx := context.Background()
	resource := redisserver.Start(t).Client(t) // survives the failover
	primary := redisserver.Start(t)
	px := startProxy(t, primary.Addr) // the replication link, to stall it
	_, pxPort, _ := strings.Cut(px.Addr(), ":")
	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", pxPort)
	sc, fc := watchedBySentinel(t, primary, replica)
	rc := replica.Client(t)

	const key = "failover"
	write := func(token int64) bool {
		n, err := fenceWrite.Run(ctx, resource, []string{"failover:resource"}, token).Int()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	// Some holds, replicated.
	for i := 0; i < 3; i++ {
		rl := NewRedisLock(FromGoRedis(fc), key, WithFencing())
		mustAcquire(t, rl)
		mustRelease(t, rl)
	}
	if n, err := fc.Wait(ctx, 1, 5000).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT: %d replicas, %v", n, err)
	}

	// Replication stalls; A takes the lock and writes.
	px.delay.Store(int64(time.Minute))
	a := NewRedisLock(FromGoRedis(fc), key, WithFencing(), WithExpiry(3*time.Second))
	mustAcquire(t, a)
	tokenA := a.Token()
	if !write(tokenA) {
		t.Fatal("A's first write was refused")
	}
	if rc.Exists(ctx, key).Val() != 0 {
		t.Fatal("the replica has the key: replication did not stall")
	}

	// The failover promotes the replica that never saw A's lock.
	failOver(t, sc, replica)

	// B gets the lock on the new primary while A may still believe it holds.
	b := NewRedisLock(FromGoRedis(fc), key, WithFencing())
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	giveUp := time.AfterFunc(20*time.Second, cancel)
	if err := b.AcquireWait(bctx); err != nil {
		t.Fatalf("B: %v", err)
	}
	giveUp.Stop()
	bothBelieved := !isClosed(a.Done()) && time.Now().Before(a.Until())
	tokenB := b.Token()
	bWrote := write(tokenB)

	// A learns the loss, and its stale write is refused.
	waitDone(t, a.Done(), "A after the failover")
	aLost := errors.Is(a.Err(), ErrLockLost)
	staleAccepted := write(tokenA)
	t.Logf("A token %d, B token %d; both believed they held at once: %v; B's write accepted %v; A reported loss %v (%v); A's stale write accepted %v",
		tokenA, tokenB, bothBelieved, bWrote, aLost, a.Err(), staleAccepted)

	var violations int64
	for _, bad := range []bool{tokenB <= tokenA, !bWrote, !aLost, staleAccepted} {
		if bad {
			violations++
		}
	}
	recordFault(t, faultRow{
		Case:      "7. Sentinel failover, replication stalled",
		Injection: "SENTINEL FAILOVER to a replica that missed the lock",
		Promise:   "lock may be lost (observed both holding: " + strconv.FormatBool(bothBelieved) + "); loss reported; next token higher; stale write refused",
		Runs:      1, Faults: 1, Violations: violations,
	})
	a.Release()
	mustRelease(t, b)
}

// watchedBySentinel waits for replica to be in sync with primary, starts a
// Sentinel watching them as "mymaster", waits for it to find the replica,
// and returns a client of the Sentinel and a failover client of the set.
func watchedBySentinel(t *testing.T, primary, replica *redisserver.Server) (*redis.SentinelClient, *redis.Client) {
	ctx := context.Background()
	rc := replica.Client(t)
	waitFor(t, 15*time.Second, "the replica to sync", func() bool {
		return strings.Contains(rc.Info(ctx, "replication").Val(), "master_link_status:up")
	})
	sentinel := redisserver.StartSentinel(t, "mymaster", primary.Addr)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel.Addr})
	t.Cleanup(func() { _ = sc.Close() })
	waitFor(t, 30*time.Second, "the sentinel to find the replica", func() bool {
		replicas, _ := sc.Replicas(ctx, "mymaster").Result()
		for _, r := range replicas {
			if r["port"] == strconv.Itoa(replica.Port) && r["flags"] == "slave" {
				return true
			}
		}
		return false
	})
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{sentinel.Addr}})
	t.Cleanup(func() { _ = fc.Close() })
	return sc, fc
}

// failOver has the Sentinel of sc promote replica, and waits until it has.
func failOver(t *testing.T, sc *redis.SentinelClient, replica *redisserver.Server) {
	ctx := context.Background()
	if err := sc.Failover(ctx, "mymaster").Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	rc := replica.Client(t)
	waitFor(t, 30*time.Second, "the replica to be promoted", func() bool {
		addr, _ := sc.GetMasterAddrByName(ctx, "mymaster").Result()
		return len(addr) == 2 && addr[1] == strconv.Itoa(replica.Port) &&
			strings.Contains(rc.Info(ctx, "replication").Val(), "role:master")
	})
}
