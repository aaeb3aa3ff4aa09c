package redislock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock/internal/redisserver"
	"github.com/redislock/redislock/internal/store"
)

// replicated is a primary and its replica, which replicates through link
// (a faultProxy, to delay or stall replication) or, when paused, not at
// all.
type replicated struct {
	primary, replica *redisserver.Server
	link             *faultProxy
	rc               *redis.Client // of the replica, for the test's reads
}

// startReplicated starts a primary and a replica of it, replicating
// through a proxy, and waits until the replica is in sync.
func startReplicated(t *testing.T) *replicated {
	t.Helper()
	primary := redisserver.Start(t)
	link := startProxy(t, primary.Addr)
	_, port, _ := strings.Cut(link.Addr(), ":")
	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", port)
	primary.WaitReplicas(t, 1)
	return &replicated{primary: primary, replica: replica, link: link, rc: replica.Client(t)}
}

// holds reports whether the replica has owner as the holder of key: its
// value, or one of its holders.
func (rs *replicated) holds(key, owner string) bool {
	ctx := context.Background()
	v, err := rs.rc.Get(ctx, key).Result()
	if err != nil || v != store.PermitsMark && v != store.SharedMark {
		return err == nil && v == owner
	}
	return rs.rc.ZScore(ctx, relatedName(key, "holders"), owner).Err() == nil // a semaphore's or a shared lock's
}

// replicaKinds are the kinds of lock WithReplicas covers.
var replicaKinds = []struct {
	name string
	opts []Option
}{
	{"plain", nil},
	{"fenced", []Option{WithFencing()}},
	{"fair", []Option{WithFairness(), WithFencing()}},
	{"permits", []Option{WithPermits(2), WithFencing()}},
	{"shared", []Option{WithShared()}},
	{"fair permits", []Option{WithPermits(2), WithFairness()}},
	{"fair shared", []Option{WithShared(), WithFairness(), WithFencing()}},
}

// TestReplicasHaveTheHoldWhenItIsReported: with WithReplicas(1), the
// replica has the key of every kind of hold when its acquisition returns,
// and when a fair release's handoff is reported to the waiter, although
// replication lags 100 ms behind. Without it, the same acquisitions are
// reported before the replica has them: the check can fail.
func TestReplicasHaveTheHoldWhenItIsReported(t *testing.T) {
	rs := startReplicated(t)
	rs.link.delay.Store(int64(100 * time.Millisecond)) // each way: an acknowledgement comes 200 ms after the write
	const lease = 5 * time.Second                      // WAIT waits 500 ms
	c := rs.primary.Client(t)
	ctx := context.Background()
	for _, kind := range replicaKinds {
		t.Run(kind.name, func(t *testing.T) {
			for _, n := range []int{1, 0} {
				key := kind.name + ":" + string(rune('0'+n))
				opts := append([]Option{WithReplicas(n), WithExpiry(lease)}, kind.opts...)
				a := NewRedisLock(FromGoRedis(c), key, opts...)
				mustAcquire(t, a)
				if got := rs.holds(key, a.Owner()); got != (n == 1) {
					t.Errorf("WithReplicas(%d): the replica has the hold at once: %v", n, got)
				}
				mustAcquire(t, a) // a re-entry
				// A waiter on a client of its own, handed the lock by a's
				// release (a fair lock), or woken by it: of the same kind,
				// or exclusive where a is shared.
				bOpts := opts
				switch {
				case a.opts.permits > 0:
					other := NewRedisLock(FromGoRedis(c), key, opts...)
					mustAcquire(t, other) // the second permit: b waits for a's
					defer mustRelease(t, other)
				case a.opts.shared:
					bOpts = []Option{WithReplicas(n), WithExpiry(lease)}
					if a.fair() {
						bOpts = append(bOpts, WithFairness())
					}
				}
				b := NewRedisLock(FromGoRedis(newClient(t, rs.primary.Addr)), key, bOpts...)
				acquired := make(chan error, 1)
				go func() { acquired <- b.AcquireWait(ctx) }()
				if b.fair() { // queued: a's release hands the lock over
					waitFor(t, 10*time.Second, "b to queue", func() bool { return c.ZCard(ctx, relatedName(key, "queue")).Val() > 0 })
				}
				mustRelease(t, a)
				mustRelease(t, a)
				if err := <-acquired; err != nil {
					t.Fatalf("b: %v", err)
				}
				if got := rs.holds(key, b.Owner()); got != (n == 1) {
					t.Errorf("WithReplicas(%d): the replica has the waiter's hold at once: %v", n, got)
				}
				mustRelease(t, b)
			}
		})
	}
}

// TestReplicasLagging: a replica paused (SIGSTOP) acknowledges nothing.
// An acquisition is given back and fails with ErrNotReplicated; a wait
// gives up with ErrNotAcquired and ErrNotReplicated; a hold's renewals fail
// until its lease ends it; a fair waiter handed the lock keeps it, and
// takes it over once the replica resumes.
func TestReplicasLagging(t *testing.T) {
	rs := startReplicated(t)
	c := rs.primary.Client(t)
	ctx := context.Background()
	const lease = time.Second
	held := NewRedisLock(FromGoRedis(c), "held", WithReplicas(1), WithExpiry(lease))
	mustAcquire(t, held)
	fairHolder := NewRedisLock(FromGoRedis(c), "fair", WithReplicas(1), WithExpiry(lease), WithFairness())
	mustAcquire(t, fairHolder)
	waiter := NewRedisLock(FromGoRedis(newClient(t, rs.primary.Addr)), "fair", WithReplicas(1), WithExpiry(lease), WithFairness())
	waited := make(chan error, 1)
	go func() { waited <- waiter.AcquireWait(ctx) }()
	waitFor(t, 10*time.Second, "the fair waiter to queue", func() bool { return c.ZCard(ctx, "{fair}:redislock:queue").Val() == 1 })

	rs.replica.Signal(t, syscall.SIGSTOP)
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			rs.replica.Signal(t, syscall.SIGCONT)
		}
	}
	defer resume()

	// The fair holder's release hands the lock to the waiter, which does
	// not report it before the replica has it, and keeps it meanwhile.
	was := fairHolder.Owner()
	mustRelease(t, fairHolder)
	select {
	case err := <-waited:
		t.Fatalf("the fair waiter returned with the replica paused: %v", err)
	case <-time.After(2 * lease):
	}
	handed := c.Get(ctx, "fair").Val()
	if handed == "" || handed == was {
		t.Fatalf("the key holds %q after the handoff (the holder was %q)", handed, was)
	}

	for _, kind := range replicaKinds {
		rl := NewRedisLock(FromGoRedis(c), "lag:"+kind.name, append([]Option{WithReplicas(1), WithExpiry(lease)}, kind.opts...)...)
		ok, err := rl.Acquire()
		if ok || !errors.Is(err, ErrNotReplicated) || !store.Ambiguous(err) {
			t.Fatalf("%s: Acquire with the replica paused: %v, %v", kind.name, ok, err)
		}
		wctx, cancel := context.WithTimeout(ctx, 400*time.Millisecond)
		err = rl.AcquireWait(wctx)
		cancel()
		if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, ErrNotReplicated) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: AcquireWait with the replica paused: %v", kind.name, err)
		}
		// A RetryStrategy that gives up says why the last attempt failed.
		once := NewRedisLock(FromGoRedis(c), "lag:"+kind.name, append([]Option{WithReplicas(1), WithExpiry(lease), WithRetry(LimitRetry(FixedRetry(time.Millisecond), 1))}, kind.opts...)...)
		err = once.AcquireWait(ctx)
		if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, ErrNotReplicated) || strings.Contains(err.Error(), "still held") {
			t.Fatalf("%s: AcquireWait of one attempt with the replica paused: %v", kind.name, err)
		}
		waitGiveBacks(rl, once)
		if n := c.Exists(ctx, rl.Key()).Val(); n != 0 && rs.primary != nil {
			if kind.opts == nil || rl.opts.permits == 0 && !rl.opts.shared {
				t.Errorf("%s: the key is left after the acquisitions were given back: %v", kind.name, c.Get(ctx, rl.Key()).Val())
			} else if holders, _ := rl.Holders(ctx); len(holders) > 0 {
				t.Errorf("%s: holders left after the acquisitions were given back: %v", kind.name, holders)
			}
		}
	}

	// The hold taken before the pause: its renewals fail, and its lease
	// ends it.
	waitDone(t, held.Done(), "the hold whose renewals the replica did not acknowledge")
	if err := held.Err(); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("held: Err = %v", err)
	}
	resume()
	if err := <-waited; err != nil || waiter.Owner() != handed {
		t.Fatalf("the fair waiter after the replica resumed: %v; it holds as %q, handed %q", err, waiter.Owner(), handed)
	}
	waitFor(t, 5*time.Second, "the replica to have the waiter's hold", func() bool { return rs.holds("fair", waiter.Owner()) })
	mustRelease(t, waiter)
	held.Release()
}

// TestReplicasLostHoldGivesItsKeyBack: renewals that the replicas did
// not acknowledge extended the key on the primary; once the lease ended
// the hold, the key is given back rather than kept from others for
// nobody.
func TestReplicasLostHoldGivesItsKeyBack(t *testing.T) {
	rs := startReplicated(t)
	c := rs.primary.Client(t)
	const lease = 3 * time.Second
	l := NewLocker(FromGoRedis(c))
	defer l.Close()
	rl := l.NewLock("lost", WithReplicas(1), WithExpiry(lease))
	mustAcquire(t, rl)
	id := rl.Owner()
	rs.replica.Signal(t, syscall.SIGSTOP)
	defer rs.replica.Signal(t, syscall.SIGCONT)
	waitDone(t, rl.Done(), "the hold whose renewals the replica did not acknowledge")
	if err := rl.Err(); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("Err = %v", err)
	}
	rl.mu.Lock() // the scheduler's report of the end starts the give-back under it
	rl.mu.Unlock()
	waitGiveBacks(rl)
	if v := c.Get(context.Background(), "lost").Val(); v == id {
		t.Errorf("the key of the hold that ended still holds its id, for %v", c.PTTL(context.Background(), "lost").Val())
	}
}

// TestReplicasTooFew: asking for more replicas than are online fails at
// once, writing nothing and waiting for nothing (no WAIT was sent), for an
// acquisition and a wait alike.
func TestReplicasTooFew(t *testing.T) {
	rs := startReplicated(t)
	c := rs.primary.Client(t)
	ctx := context.Background()
	must(t, c.ConfigResetStat(ctx).Err())
	for _, kind := range replicaKinds {
		rl := NewRedisLock(FromGoRedis(c), "few:"+kind.name, append([]Option{WithReplicas(2)}, kind.opts...)...)
		if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrNotReplicated) || store.Ambiguous(err) || !strings.Contains(err.Error(), "1 online, 2 asked for") {
			t.Fatalf("%s: Acquire: %v, %v", kind.name, ok, err)
		}
		if err := rl.AcquireWait(ctx); !errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("%s: AcquireWait: %v", kind.name, err)
		}
	}
	huge := NewRedisLock(FromGoRedis(c), "few:huge", WithReplicas(math.MaxInt))
	if ok, err := huge.Acquire(); ok || !errors.Is(err, ErrNotReplicated) || !strings.Contains(err.Error(), fmt.Sprintf("1 online, %d asked for", math.MaxInt)) {
		t.Fatalf("WithReplicas(MaxInt): Acquire: %v, %v", ok, err)
	}
	if keys := c.Keys(ctx, "*").Val(); len(keys) != 0 {
		t.Errorf("keys written: %v", keys)
	}
	if stats := c.Info(ctx, "commandstats").Val(); strings.Contains(stats, "cmdstat_wait:") {
		t.Errorf("WAIT was sent: %s", stats)
	}
	// A call that finds too few replicas online sends no WAIT after it,
	// even once a call for fewer did.
	waited := NewRedisLock(FromGoRedis(c), "few", WithReplicas(1))
	mustAcquire(t, waited)
	mustRelease(t, waited)
	rl := NewRedisLock(FromGoRedis(c), "few", WithReplicas(2))
	for range 3 {
		if ok, err := rl.Acquire(); ok || !errors.Is(err, ErrNotReplicated) || store.Ambiguous(err) {
			t.Fatalf("Acquire of 2 after 1: %v, %v", ok, err)
		}
	}
	stats := c.Info(ctx, "commandstats").Val()
	if !strings.Contains(stats, "cmdstat_wait:calls=1,") { // the acquisition of 1
		t.Errorf("WAIT: %s", stats)
	}
	// No replica at all.
	alone := redisserver.Start(t).Client(t)
	if ok, err := NewRedisLock(FromGoRedis(alone), "few", WithReplicas(1)).Acquire(); ok || !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("no replica: %v, %v", ok, err)
	}
}

// TestReplicasReplyLost: the reply of an acquisition's round trip (its
// script's and WAIT's) is lost after the server ran it, and the client
// sends it again on another connection. The retry finds the hold taken,
// and its WAIT covers the first run's writes, which replication delays
// by 100 ms: when the acquisition returns, the replica has it. Without
// call.lua's PEXPIREAT, a retry that writes nothing (a fenced permit's)
// had its WAIT answered at once on Valkey 8.0, which starts a new
// connection's WAIT at offset 0 (Redis 7.0 at the offset it has then).
func TestReplicasReplyLost(t *testing.T) {
	rs := startReplicated(t)
	rs.link.delay.Store(int64(100 * time.Millisecond))
	px := startProxy(t, rs.primary.Addr)
	stores := map[string]Scripter{
		// At once: a retry after go-redis's usual backoff could find the
		// first run replicated already.
		"go-redis": FromGoRedis(redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: 3, MinRetryBackoff: -1, MaxRetryBackoff: -1})),
		"go-zero":  goZeroStore(t, px.Addr()),
	}
	for name, s := range stores {
		for _, kind := range replicaKinds {
			key := "lost:" + name + ":" + kind.name
			opts := append([]Option{WithReplicas(1), WithExpiry(5 * time.Second)}, kind.opts...)
			rl := NewRedisLock(s, key, opts...)
			// A pooled connection, the script loaded and the replicas
			// known to be online: the drop hits the reply of the script
			// that took the lock.
			warm := NewRedisLock(s, key+":warm", opts...)
			mustAcquire(t, warm)
			mustRelease(t, warm)
			drops := px.replyDrops.Load()
			px.dropReplies.Store(1)
			if ok, err := rl.Acquire(); !ok || err != nil {
				t.Fatalf("%s: Acquire after a lost reply: %v, %v", key, ok, err)
			}
			if px.replyDrops.Load() != drops+1 {
				t.Fatalf("%s: %d replies dropped, want 1", key, px.replyDrops.Load()-drops)
			}
			if !rs.holds(key, rl.Owner()) {
				t.Errorf("%s: the replica has not the hold when its acquisition returned", key)
			}
			mustRelease(t, rl)
		}
	}
}

// TestReplicasOptionAndStores: a negative number is an error; a store
// that cannot send WAIT after a script on its key's primary refuses the
// option at its first call, sending nothing; 0 is no WAIT; a Locker's
// WithReplicas is its locks' default.
func TestReplicasOptionAndStores(t *testing.T) {
	mr, c := newMini(t)
	if ok, err := NewRedisLock(FromGoRedis(c), "k", WithReplicas(-1)).Acquire(); ok || !errors.Is(err, ErrInvalidReplicas) {
		t.Fatalf("WithReplicas(-1): %v, %v", ok, err)
	}
	sent := 0
	own := scripterFunc(func(context.Context, *redis.Script, []string, ...any) (any, error) { sent++; return "OK", nil })
	clusterOfGoZero := zredis.New(mr.Addr(), zredis.Cluster())
	for name, s := range map[string]Scripter{"a Scripter of one's own": own, "go-zero's Cluster store": clusterOfGoZero} {
		rl := NewRedisLock(s, "k", WithReplicas(1))
		ok, err := rl.Acquire()
		if ok || !errors.Is(err, ErrNotReplicated) || !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("%s: %v, %v", name, ok, err)
		}
		if err := rl.AcquireWait(context.Background()); !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("%s: AcquireWait: %v", name, err)
		}
	}
	if sent != 0 || len(mr.Keys()) != 0 {
		t.Fatalf("%d scripts sent, keys %v", sent, mr.Keys())
	}
	zero := NewRedisLock(FromGoRedis(c), "zero", WithReplicas(0)) // miniredis has no replicas, and none are asked for
	mustAcquire(t, zero)
	mustRelease(t, zero)
	l := NewLocker(FromGoRedis(redisserver.Start(t).Client(t)), WithReplicas(1)) // without replicas
	defer l.Close()
	if ok, err := l.NewLock("k").Acquire(); ok || !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("a Locker's default: %v, %v", ok, err)
	}
}

// TestReplicasLockerBatches: the holds of a Locker are renewed in batches
// that WAIT follows, and kept while the replica acknowledges them; once it
// is paused, each ends when its lease runs out, with ErrLockLost and
// ErrNotReplicated.
func TestReplicasLockerBatches(t *testing.T) {
	rs := startReplicated(t)
	c := rs.primary.Client(t)
	const lease = 600 * time.Millisecond
	l := NewLocker(FromGoRedis(c), WithReplicas(1), WithExpiry(lease))
	defer l.Close()
	var locks []*RedisLock
	for i := range 60 {
		opts := replicaKinds[i%len(replicaKinds)].opts
		rl := l.NewLock("batch:"+strconv.Itoa(i), opts...)
		mustAcquire(t, rl)
		locks = append(locks, rl)
	}
	must(t, c.ConfigResetStat(context.Background()).Err())
	time.Sleep(3 * lease) // renewed, every lease/3
	stats := c.Info(context.Background(), "commandstats").Val()
	for _, rl := range locks {
		if isClosed(rl.Done()) || !rs.holds(rl.Key(), rl.Owner()) {
			t.Fatalf("%s: lost (%v), or not on the replica; %s", rl.Key(), rl.Err(), stats)
		}
	}
	if !strings.Contains(stats, "cmdstat_wait:") {
		t.Fatalf("no WAIT after the renewals: %s", stats)
	}
	rs.replica.Signal(t, syscall.SIGSTOP)
	defer rs.replica.Signal(t, syscall.SIGCONT)
	for _, rl := range locks {
		waitDone(t, rl.Done(), rl.Key())
		if err := rl.Err(); !errors.Is(err, ErrLockLost) || !errors.Is(err, ErrNotReplicated) {
			t.Fatalf("%s: Err = %v", rl.Key(), err)
		}
	}
	releaseAll(locks...)
}

// TestClusterReplicas: on a Cluster whose first primary has a replica,
// WAIT goes to each key's primary: a hold on its slots is taken, renewed
// and on the replica; one on another primary's finds too few replicas, at
// once.
func TestClusterReplicas(t *testing.T) {
	cl := redisserver.StartCluster(t, 3)
	replica := cl.AddReplica(t, 0)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	keyOn := func(node int) string {
		for i := 0; ; i++ {
			key := "k" + strconv.Itoa(i)
			if n, err := c.MasterForKey(ctx, key); err == nil && n.Options().Addr == cl.Nodes[node].Addr {
				return key
			}
		}
	}
	rc := replica.Client(t)
	for _, kind := range replicaKinds {
		opts := append([]Option{WithReplicas(1), WithExpiry(600 * time.Millisecond)}, kind.opts...)
		on, off := keyOn(0), keyOn(1)
		rl := NewRedisLock(FromGoRedis(c), on, opts...)
		mustAcquire(t, rl)
		if keys := rc.Keys(ctx, "*").Val(); !slices.Contains(keys, on) {
			t.Fatalf("%s: the replica has %v, not %q", kind.name, keys, on)
		}
		until := rl.Until()
		waitFor(t, 5*time.Second, "a renewal", func() bool { return rl.Until().After(until) || isClosed(rl.Done()) })
		if isClosed(rl.Done()) {
			t.Fatalf("%s: lost: %v", kind.name, rl.Err())
		}
		mustRelease(t, rl)
		if ok, err := NewRedisLock(FromGoRedis(c), off, opts...).Acquire(); ok || !errors.Is(err, ErrNotReplicated) || store.Ambiguous(err) {
			t.Fatalf("%s on a primary without replicas: %v, %v", kind.name, ok, err)
		}
	}
}

// TestReplicasACL: WithReplicas needs INFO (in @dangerous) and WAIT, and
// the PEXPIREAT and PEXPIRETIME of call.lua: the documented ACL with
// +info is enough; without INFO, WAIT or PEXPIREAT an acquisition is
// refused, naming the command, before it writes anything.
func TestReplicasACL(t *testing.T) {
	rs := startReplicated(t)
	ctx := context.Background()
	admin := rs.primary.Client(t)
	must(t, admin.Do(ctx, "ACL", "SETUSER", "app", "reset", "on", ">pw", "~app:*", "~{app:*", "&app:*", "&{app:*", "+@all", "-@dangerous", "+info").Err())
	c := redis.NewClient(&redis.Options{Addr: rs.primary.Addr, Username: "app", Password: "pw"})
	defer c.Close()
	for _, kind := range replicaKinds {
		holder := NewRedisLock(FromGoRedis(c), "app:"+kind.name, append([]Option{WithReplicas(1)}, kind.opts...)...)
		mustAcquire(t, holder)
		mustAcquire(t, holder)
		if !rs.holds(holder.Key(), holder.Owner()) {
			t.Fatalf("%s: not on the replica", kind.name)
		}
		mustRelease(t, holder)
		mustRelease(t, holder)
	}
	for _, command := range []string{"info", "wait", "pexpireat"} {
		c, _ := aclUser(t, rs.primary, "no"+command, "-"+command)
		for _, kind := range replicaKinds {
			key := "no" + command + ":" + kind.name
			ok, err := NewRedisLock(FromGoRedis(c), key, append([]Option{WithReplicas(1)}, kind.opts...)...).Acquire()
			if ok {
				t.Fatalf("%s without %s: acquired", kind.name, command)
			}
			refusedBy(t, kind.name+" without "+command, err, command)
			if keys := admin.Keys(ctx, "*"+key+"*").Val(); len(keys) != 0 {
				t.Fatalf("%s without %s: wrote %v", kind.name, command, keys)
			}
		}
	}
}
