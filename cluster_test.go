package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/keyslot"
	"github.com/redislock/redislock/internal/redisserver"
)

func startCluster(t *testing.T) (*redis.ClusterClient, []*redis.Client) {
	cl := redisserver.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	var nodes []*redis.Client
	for _, n := range cl.Nodes {
		nodes = append(nodes, n.Client(t))
	}
	return c, nodes
}

func TestClusterLocksAcrossSlots(t *testing.T) {
	c, _ := startCluster(t)
	ctx := context.Background()
	owners := map[string]bool{}
	for _, key := range []string{"alpha", "beta", "gamma", "delta", "{user:1}:a", "{user:1}:b", "\x00bin{x}", "a}b", "{}x", "x}{"} {
		rl := NewRedisLock(FromGoRedis(c), key, WithFencing())
		other := NewRedisLock(FromGoRedis(c), key, WithFencing())
		mustAcquire(t, rl)
		if ok, err := other.Acquire(); ok || err != nil {
			t.Fatalf("%q: a second lock got %v, %v", key, ok, err)
		}
		first := rl.Token()
		if v := c.Get(ctx, key).Val(); v != holderID(rl) {
			t.Fatalf("%q holds %q", key, v)
		}
		if d, err := rl.TTL(ctx); err != nil || d <= 0 {
			t.Fatalf("%q: TTL %v, %v", key, d, err)
		}
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		owners[node.Options().Addr] = true
		mustRelease(t, rl)
		mustAcquire(t, other) // and the next holder's token is higher
		if other.Token() <= first {
			t.Fatalf("%q: the next token %d is not above %d", key, other.Token(), first)
		}
		if st, err := rl.Inspect(ctx); err != nil || st.Owner != other.Owner() || st.Fence != other.Token() {
			t.Fatalf("%q: Inspect = %+v, %v", key, st, err)
		}
		if st, err := rl.Break(ctx, other.Owner()); err != nil || st.Owner != other.Owner() {
			t.Fatalf("%q: Break = %+v, %v", key, st, err)
		}
		if ok, err := other.Release(); ok || !errors.Is(err, ErrLockLost) {
			t.Fatalf("%q: the broken holder's Release = %v, %v", key, ok, err)
		}
	}
	if len(owners) < 2 {
		t.Fatalf("all keys on %d node(s): the test did not cross slots", len(owners))
	}
}

func TestClusterWakeUp(t *testing.T) {
	c, _ := startCluster(t)
	elapsed := requireReleaseWakes(t, c, "cluster-wait")
	t.Logf("woken %v after the release, through a ClusterClient", elapsed)
}

func TestClusterSlotMigrationKeepsLock(t *testing.T) {
	c, nodes := startCluster(t)
	ctx := context.Background()
	const key = "migrating"
	s := newSpy(FromGoRedis(c))
	rl := NewRedisLock(s, key, WithExpiry(time.Second), WithFencing())
	mustAcquire(t, rl)
	renewed := func(what string) { // two more renewals, and still held
		t.Helper()
		for n := s.count(extendScript) + 2; s.count(extendScript) < n; time.Sleep(10 * time.Millisecond) {
			if isClosed(rl.Done()) {
				t.Fatalf("lost %s: %v", what, rl.Err())
			}
		}
	}

	m := newMigration(t, c, nodes, key)
	slot, from, to, fromID, toID, must := m.slot, m.from, m.to, m.fromID, m.toID, m.must
	renewed("before the migration")
	must(to.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID))
	must(from.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID))
	renewed("while the slot is migrating")

	keys, err := from.Do(ctx, "CLUSTER", "GETKEYSINSLOT", slot, 100).StringSlice()
	if err != nil || len(keys) != 2 { // the lock and its fencing counter
		t.Fatalf("keys in slot %d: %v, %v", slot, keys, err)
	}
	host, port, _ := strings.Cut(to.Options().Addr, ":")
	p, _ := strconv.Atoi(port)
	must(from.Do(ctx, append([]any{"MIGRATE", host, p, "", 0, 5000, "KEYS"}, toAny(keys)...)...))
	renewed("after its keys moved (ASK)")

	for _, n := range nodes {
		must(n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", toID))
	}
	renewed("after the slot moved (MOVED)")

	if v := to.Get(ctx, key).Val(); v != holderID(rl) {
		t.Fatalf("the target node holds %q, want our id", v)
	}
	token := rl.Token()
	mustRelease(t, rl)
	next := NewRedisLock(FromGoRedis(c), key, WithFencing())
	mustAcquire(t, next)
	if next.Token() <= token {
		t.Fatalf("next token %d is not above %d", next.Token(), token)
	}
	if v := to.Get(ctx, "{"+key+"}:redislock:fence").Val(); v != strconv.FormatInt(next.Token(), 10) {
		t.Fatalf("the counter did not move with the slot: %q on the target", v)
	}
	mustRelease(t, next)
}

// migration is the slot of a key, the node that owns it (from) and another
// node to move it to.
type migration struct {
	slot         int
	from, to     *redis.Client
	fromID, toID string
	must         func(cmd *redis.Cmd)
}

func newMigration(t *testing.T, c *redis.ClusterClient, nodes []*redis.Client, key string) migration {
	t.Helper()
	ctx := context.Background()
	owner, err := c.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	m := migration{slot: int(keyslot.Of(key))}
	for _, n := range nodes {
		switch {
		case n.Options().Addr == owner.Options().Addr:
			m.from = n
		case m.to == nil:
			m.to = n
		}
	}
	m.fromID = m.from.Do(ctx, "CLUSTER", "MYID").Val().(string)
	m.toID = m.to.Do(ctx, "CLUSTER", "MYID").Val().(string)
	m.must = func(cmd *redis.Cmd) {
		t.Helper()
		if err := cmd.Err(); err != nil {
			t.Fatalf("%v: %v", cmd.Args(), err)
		}
	}
	return m
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// clusterHolds takes n locks of l, with keys from key(i), and returns them.
func clusterHolds(t *testing.T, l *Locker, n int, key func(i int) string) []*RedisLock {
	t.Helper()
	locks := make([]*RedisLock, n)
	for i := range locks {
		locks[i] = l.NewLock(key(i))
		mustAcquire(t, locks[i])
	}
	return locks
}

// notHeld counts (and reports) the locks whose hold ended or whose key
// does not hold their id.
func notHeld(t *testing.T, c *redis.ClusterClient, locks []*RedisLock, what string) int {
	t.Helper()
	n := 0
	for _, rl := range locks {
		if isClosed(rl.Done()) {
			t.Errorf("%s: %q lost: %v", what, rl.Key(), rl.Err())
			n++
		} else if v := c.Get(context.Background(), rl.Key()).Val(); v != holderID(rl) {
			t.Errorf("%s: %q holds %q, want our id", what, rl.Key(), v)
			n++
		}
	}
	return n
}

// A slot migrated while its locks renew in batches with locks of other
// slots: the pipeline follows ASK and MOVED per command, and no hold of the
// migrating slot or of any other is lost.
func TestClusterSlotMigrationUnderBatches(t *testing.T) {
	c, nodes := startCluster(t)
	ctx := context.Background()
	hook := &pipelineCounter{}
	c.AddHook(hook)
	l := NewLocker(FromGoRedis(c), WithExpiry(900*time.Millisecond))
	t.Cleanup(func() { _ = l.Close() })
	moving := clusterHolds(t, l, 20, func(i int) string { return fmt.Sprintf("{mig}:%d", i) })
	others := clusterHolds(t, l, 100, func(i int) string { return fmt.Sprintf("other:%d", i) })
	all := append(append([]*RedisLock{}, moving...), others...)
	phases, violations := 0, 0
	rounds := func(what string) { // two more renewal rounds, every lock kept
		t.Helper()
		phases++
		for n := hook.pipelines.Load() + 2; hook.pipelines.Load() < n; time.Sleep(10 * time.Millisecond) {
		}
		violations += notHeld(t, c, all, what)
	}

	m := newMigration(t, c, nodes, "{mig}")
	slot, from, to, fromID, toID, must := m.slot, m.from, m.to, m.fromID, m.toID, m.must
	rounds("before the migration")
	must(to.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID))
	must(from.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID))
	rounds("while the slot is migrating")
	// Move the keys in two steps, so that a round renews with the slot's
	// keys split between the nodes (ASK for the moved ones).
	keys, err := from.Do(ctx, "CLUSTER", "GETKEYSINSLOT", slot, 100).StringSlice()
	if err != nil || len(keys) != len(moving) {
		t.Fatalf("keys in slot %d: %v, %v", slot, keys, err)
	}
	host, port, _ := strings.Cut(to.Options().Addr, ":")
	p, _ := strconv.Atoi(port)
	half := len(keys) / 2
	must(from.Do(ctx, append([]any{"MIGRATE", host, p, "", 0, 5000, "KEYS"}, toAny(keys[:half])...)...))
	rounds("with half the slot's keys moved (ASK)")
	must(from.Do(ctx, append([]any{"MIGRATE", host, p, "", 0, 5000, "KEYS"}, toAny(keys[half:])...)...))
	rounds("with all its keys moved (ASK)")
	for _, n := range nodes {
		must(n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", toID))
	}
	rounds("after the slot moved (MOVED)")
	for _, rl := range moving {
		if v := to.Get(ctx, rl.Key()).Val(); v != holderID(rl) {
			t.Errorf("the target node holds %q for %q, want our id", v, rl.Key())
			violations++
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, rl := range all {
		if n := c.Exists(ctx, rl.Key()).Val(); n != 0 {
			t.Errorf("%q left after Close", rl.Key())
			violations++
		}
	}
	recordFault(t, faultRow{
		Case:      "10. cluster slot migrated under batched renewal",
		Injection: "SETSLOT MIGRATING/IMPORTING, MIGRATE half the slot's keys, then the rest, then SETSLOT NODE, while 120 locks of a Locker (20 in the slot) renew, lease 900 ms",
		Promise:   "no hold lost in any phase (ASK and MOVED followed per command); Close deletes every key",
		Runs:      int64(len(all)), Faults: int64(phases - 1), Violations: int64(violations), // the first phase is before any fault
	})
}

// A node paused longer than the lease: the holds of its keys end with
// ErrLockLost when their leases run out, and the holds on the other nodes,
// renewed in the same rounds, are kept.
func TestClusterNodePausedLongerThanLease(t *testing.T) {
	c, nodes := startCluster(t)
	ctx := context.Background()
	const lease = 600 * time.Millisecond
	l := NewLocker(FromGoRedis(c), WithExpiry(lease))
	t.Cleanup(func() { _ = l.Close() })
	locks := clusterHolds(t, l, 90, func(i int) string { return fmt.Sprintf("pause:%d", i) })
	paused := nodes[0]
	var onPaused, elsewhere []*RedisLock
	for _, rl := range locks {
		n, err := c.MasterForKey(ctx, rl.Key())
		if err != nil {
			t.Fatal(err)
		}
		if n.Options().Addr == paused.Options().Addr {
			onPaused = append(onPaused, rl)
		} else {
			elsewhere = append(elsewhere, rl)
		}
	}
	if len(onPaused) == 0 || len(elsewhere) == 0 {
		t.Fatalf("%d locks on the paused node, %d elsewhere: the test needs both", len(onPaused), len(elsewhere))
	}
	time.Sleep(lease) // a few rounds first
	if notHeld(t, c, locks, "before the pause") > 0 {
		t.FailNow()
	}

	// 1.5 s: over twice the lease, under the cluster's node timeout (2 s),
	// so that the other nodes keep serving.
	sleeping := make(chan error, 1)
	go func() { sleeping <- paused.Do(ctx, "DEBUG", "SLEEP", "1.5").Err() }()
	violations := 0
	for _, rl := range onPaused {
		waitDone(t, rl.Done(), "a hold on the paused node")
		if !errors.Is(rl.Err(), ErrLockLost) {
			t.Errorf("%q ended with %v, want ErrLockLost", rl.Key(), rl.Err())
			violations++
		}
	}
	if err := <-sleeping; err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease) // rounds after the pause
	violations += notHeld(t, c, elsewhere, "after the pause")
	for _, rl := range onPaused {
		if ok, err := rl.Release(); ok || !errors.Is(err, ErrLockLost) {
			t.Errorf("Release of a lost hold = %v, %v", ok, err)
			violations++
		}
	}
	recordFault(t, faultRow{
		Case:      "11. cluster node paused longer than the lease",
		Injection: "DEBUG SLEEP 1.5 s on one of 3 primaries while 90 locks of a Locker (lease 600 ms) renew in shared rounds",
		Promise:   "the paused node's holds end with ErrLockLost when their leases run out; the other nodes' holds are kept",
		Runs:      int64(len(locks)), Faults: 1, Violations: int64(violations),
	})
}
