package redislock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	for _, key := range []string{"alpha", "beta", "gamma", "delta", "{user:1}:a", "{user:1}:b", "\x00bin{x}"} {
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
		mustRelease(t, other)
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

	slot := int(hashSlot(key))
	owner, err := c.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var from, to *redis.Client
	for _, n := range nodes {
		switch {
		case n.Options().Addr == owner.Options().Addr:
			from = n
		case to == nil:
			to = n
		}
	}
	fromID, toID := from.Do(ctx, "CLUSTER", "MYID").Val().(string), to.Do(ctx, "CLUSTER", "MYID").Val().(string)
	must := func(cmd *redis.Cmd) {
		t.Helper()
		if err := cmd.Err(); err != nil {
			t.Fatalf("%v: %v", cmd.Args(), err)
		}
	}
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

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
