package redislock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redislock/redislock/internal/store"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/breaker"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock/internal/redisserver"
)

// When Redis says no (issue 25): a write Redis refuses is never an
// acquisition, a release that happened is one, and the error names what
// was refused. These tests make a real redis-server refuse writes for
// memory (maxmemory with noeviction), for being a replica (REPLICAOF while
// the client stays connected, as after a failover), for a failed save
// (MISCONF) and by ACL.

// refusal is a way to make a server refuse: set it up on srv (the server
// our client talks to), and undo it.
type refusalKind struct {
	name    string
	command string // the command Redis names in its refusal of a write ("" for a user's own)
	set     func(t *testing.T, srv *redisserver.Server)
	undo    func(t *testing.T, srv *redisserver.Server)
}

// serverRefusals are the refusals for the state of the server.
func serverRefusals() []refusalKind {
	ctx := context.Background()
	return []refusalKind{{
		name: "OOM",
		set: func(t *testing.T, srv *redisserver.Server) {
			admin := srv.Client(t)
			must(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
			must(t, admin.ConfigSet(ctx, "maxmemory", "1").Err())
		},
		undo: func(t *testing.T, srv *redisserver.Server) {
			must(t, srv.Client(t).ConfigSet(ctx, "maxmemory", "0").Err())
		},
	}, {
		name: "READONLY",
		set: func(t *testing.T, srv *redisserver.Server) {
			// Demoted: a replica of a primary that holds the same data.
			primary := redisserver.Start(t)
			admin, p := srv.Client(t), primary.Client(t)
			keys := admin.Keys(ctx, "*").Val()
			for _, k := range keys {
				dump, ttl := admin.Dump(ctx, k).Val(), admin.PTTL(ctx, k).Val()
				if ttl < 0 {
					ttl = 0
				}
				must(t, p.RestoreReplace(ctx, k, ttl, dump).Err())
			}
			must(t, admin.SlaveOf(ctx, "127.0.0.1", fmt.Sprint(primary.Port)).Err())
			waitFor(t, 10*time.Second, "the replica in sync", func() bool {
				info := admin.Info(ctx, "replication").Val()
				return strings.Contains(info, "master_link_status:up")
			})
		},
		undo: func(t *testing.T, srv *redisserver.Server) {
			must(t, srv.Client(t).SlaveOf(ctx, "NO", "ONE").Err())
		},
	}, {
		name: "MISCONF",
		set: func(t *testing.T, srv *redisserver.Server) {
			// A directory where the dump file goes: the save fails, even
			// for root.
			admin := srv.Client(t)
			dir := admin.ConfigGet(ctx, "dir").Val()["dir"]
			file := admin.ConfigGet(ctx, "dbfilename").Val()["dbfilename"]
			_ = os.Remove(filepath.Join(dir, file)) // a replica's, say
			must(t, os.MkdirAll(filepath.Join(dir, file), 0o755))
			must(t, admin.ConfigSet(ctx, "save", "3600 1").Err())
			must(t, admin.ConfigSet(ctx, "stop-writes-on-bgsave-error", "yes").Err())
			waitFor(t, 10*time.Second, "no save under way (a replica's sync, say)", func() bool {
				return strings.Contains(admin.Info(ctx, "persistence").Val(), "rdb_bgsave_in_progress:0")
			})
			must(t, admin.BgSave(ctx).Err())
			waitFor(t, 10*time.Second, "the save to fail", func() bool {
				return strings.Contains(admin.Info(ctx, "persistence").Val(), "rdb_last_bgsave_status:err")
			})
		},
		undo: func(t *testing.T, srv *redisserver.Server) {
			admin := srv.Client(t)
			must(t, admin.ConfigSet(ctx, "save", "").Err())
			dir := admin.ConfigGet(ctx, "dir").Val()["dir"]
			must(t, os.Remove(filepath.Join(dir, admin.ConfigGet(ctx, "dbfilename").Val()["dbfilename"])))
		},
	}}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// aclUser makes a user of srv with every right but those taken away (ACL
// rules such as "-set" or "resetchannels"), and returns a go-redis client
// and a go-zero store logged in as it.
func aclUser(t *testing.T, srv *redisserver.Server, name string, rules ...string) (*redis.Client, *zredis.Redis) {
	t.Helper()
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">pw", "~*", "&*", "+@all"}
	for _, r := range rules {
		args = append(args, r)
	}
	must(t, srv.Client(t).Do(context.Background(), args...).Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: name, Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	z := goZeroStoreOf(t, zredis.RedisConf{Host: srv.Addr, Type: zredis.NodeType, User: name, Pass: "pw", DisableIdentity: true})
	return c, z
}

// TestGoZeroStoresKeepTheirOwnCredentials: go-zero keeps one client per
// address string, so the tests' go-zero stores of one server (or of a port a
// later server reuses) must not share a client logged in as someone else. A
// CI run once failed with WRONGPASS on a miniredis whose port an ACL test's
// server had used.
func TestGoZeroStoresKeepTheirOwnCredentials(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	plain := goZeroStore(t, srv.Addr)
	_, readOnly := aclUser(t, srv, "reader", "-set")
	_, other := aclUser(t, srv, "other", "-get")
	if err := plain.SetCtx(ctx, "k", "v"); err != nil {
		t.Fatalf("the default user's SET: %v", err)
	}
	if err := readOnly.SetCtx(ctx, "k", "v"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("a user without SET was let SET (a shared client?): %v", err)
	}
	if _, err := other.GetCtx(ctx, "k"); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("a user without GET was let GET (a shared client?): %v", err)
	}
	if got, err := readOnly.GetCtx(ctx, "k"); err != nil || got != "v" {
		t.Fatalf("the reader's GET: %q, %v", got, err)
	}
}

// refusedBy checks that err is a refusal naming command.
func refusedBy(t *testing.T, what string, err error, command string) {
	t.Helper()
	var r *store.Refusal
	switch {
	case strings.HasPrefix(what, "go-zero") && errors.Is(err, breaker.ErrServiceUnavailable):
		return // go-zero's breaker, open after the refusals before: no call was sent
	case !errors.Is(err, ErrRefused) || !errors.As(err, &r):
		t.Errorf("%s: %v; want an error matching ErrRefused", what, err)
	case command != "" && !strings.EqualFold(r.Command, command):
		t.Errorf("%s: %v; want it to name %s", what, err, command)
	case !strings.Contains(err.Error(), command):
		t.Errorf("%s: %q does not name %s", what, err, command)
	}
	var e redis.Error
	if err != nil && !errors.As(err, &e) {
		t.Errorf("%s: %v wraps no redis.Error", what, err)
	}
}

// TestRefusedWritesAreNeverAcquisitions: Acquire, AcquireWait and Do on a
// free key and on a key another owner holds, with go-redis and go-zero's
// store, plain and fenced, under each refusal: never true, always an error
// matching ErrRefused that names SET, and the key as it was.
func TestRefusedWritesAreNeverAcquisitions(t *testing.T) {
	ctx := context.Background()
	kinds := serverRefusals()
	kinds = append(kinds, refusalKind{name: "ACL -set", command: "SET"})
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			srv := redisserver.Start(t)
			admin := srv.Client(t)
			must(t, admin.Set(ctx, "held", "other", time.Minute).Err())
			var stores map[string]Scripter
			if kind.set != nil {
				// Connected before: as a client of a primary that a failover
				// demotes stays.
				stores = map[string]Scripter{"go-redis": FromGoRedis(srv.Client(t)), "go-zero": goZeroStore(t, srv.Addr)}
				kind.set(t, srv)
				defer kind.undo(t, srv)
			} else {
				c, z := aclUser(t, srv, "noset", "-set")
				stores = map[string]Scripter{"go-redis": FromGoRedis(c), "go-zero": z}
			}
			for name, st := range stores {
				for _, key := range []string{"free", "held"} {
					for _, opts := range [][]Option{nil, {WithFencing()}} {
						what := fmt.Sprintf("%s, %s key, %d options", name, key, len(opts))
						l := NewLocker(st, append(opts, WithWaitTimeout(200*time.Millisecond))...)
						rl := l.NewLock(key)
						ok, err := rl.AcquireCtx(ctx)
						if ok {
							t.Errorf("%s: Acquire reported the lock taken", what)
						}
						refusedBy(t, what+": Acquire", err, "SET")
						err = rl.AcquireWait(ctx)
						refusedBy(t, what+": AcquireWait", err, "SET")
						ran := false
						err = rl.Do(ctx, func(context.Context) error { ran = true; return nil })
						refusedBy(t, what+": Do", err, "SET")
						if ran || rl.Holds() != 0 {
							t.Errorf("%s: Do ran fn (%v) or the lock holds %d", what, ran, rl.Holds())
						}
						must(t, l.Close())
					}
				}
			}
			if v, err := admin.Get(ctx, "held").Result(); v != "other" || err != nil {
				t.Errorf("the other owner's key holds %q, %v", v, err)
			}
			if n := admin.Exists(ctx, "free").Val(); n != 0 {
				t.Errorf("the free key was written")
			}
		})
	}
}

// TestReleaseWithoutPublishRightIsARelease: a user that may not PUBLISH
// on the lock's channel (Redis 7's default for a new ACL user) releases
// all the same: Release reports true, nil, Do returns fn's nil, and the key
// is gone; for plain and fair locks.
func TestReleaseWithoutPublishRightIsARelease(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c, z := aclUser(t, srv, "nopub", "resetchannels")
	for name, st := range map[string]Scripter{"go-redis": FromGoRedis(c), "go-zero": z} {
		for _, opts := range [][]Option{nil, {WithFairness()}, {WithFairness(), WithFencing()}} {
			what := fmt.Sprintf("%s, %d options", name, len(opts))
			l := NewLocker(st, opts...)
			rl := l.NewLock("nopub")
			mustAcquire(t, rl)
			if ok, err := rl.Release(); !ok || err != nil {
				t.Errorf("%s: Release = %v, %v; want true, nil", what, ok, err)
			}
			calls := 0
			if err := rl.Do(ctx, func(context.Context) error { calls++; return nil }); err != nil || calls != 1 {
				t.Errorf("%s: Do = %v after %d calls of fn; want nil after 1", what, err, calls)
			}
			if n := admin.Exists(ctx, "nopub").Val(); n != 0 {
				t.Errorf("%s: the key is still there", what)
			}
			if l.wake.Unheard("nopub") {
				t.Errorf("%s: the refused wake-up was not noted", what)
			}
			must(t, l.Close())
		}
	}
}

// TestBreakRefusedHalfWay: a Break either breaks and says whose lock it
// broke, or changes nothing and says why; never a record without expiry.
func TestBreakRefusedHalfWay(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	broken := relatedName("brk", "broken")
	for _, tc := range []struct {
		rules  []string
		breaks bool   // the key is deleted
		named  string // else the command the error names
	}{
		{[]string{"resetchannels"}, true, ""},
		{[]string{"-pexpire"}, true, ""},
		{[]string{"-hset"}, true, ""},
		{[]string{"-del"}, false, "DEL"},
		{[]string{"-pttl"}, false, "PTTL"},
	} {
		what := strings.Join(tc.rules, " ")
		must(t, admin.Set(ctx, "brk", "holder", time.Minute).Err())
		c, _ := aclUser(t, srv, "breaker", tc.rules...)
		st, err := NewRedisLock(FromGoRedis(c), "brk").Break(ctx, "")
		switch {
		case tc.breaks && (err != nil || st.Owner != "holder"):
			t.Errorf("%s: Break = %+v, %v; want the holder's status", what, st, err)
		case tc.breaks && admin.Exists(ctx, "brk").Val() != 0:
			t.Errorf("%s: Break said it broke the lock, and the key is there", what)
		case !tc.breaks:
			refusedBy(t, what, err, tc.named)
			if v := admin.Get(ctx, "brk").Val(); v != "holder" {
				t.Errorf("%s: the key holds %q after a refused Break", what, v)
			}
		}
		if ttl := admin.PTTL(ctx, broken).Val(); ttl == -1 {
			t.Errorf("%s: %s is left without expiry", what, broken)
		}
		must(t, admin.Del(ctx, "brk", broken).Err())
	}
}

// TestRefusedSISMEMBERIsAnError: a user denied SISMEMBER gets an error,
// not a lock whose check of given-up attempts was skipped; nothing is left.
func TestRefusedSISMEMBERIsAnError(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	c, _ := aclUser(t, srv, "nosismember", "-sismember")
	rl := NewRedisLock(FromGoRedis(c), "sism")
	ok, err := rl.AcquireCtx(ctx)
	if ok {
		t.Error("Acquire reported the lock taken")
	}
	refusedBy(t, "Acquire", err, "SISMEMBER")
	if n := srv.Client(t).Exists(ctx, "sism").Val(); n != 0 {
		t.Error("the key was left")
	}
}

// countingRetry is a fixed pace that counts its calls.
type countingRetry struct{ n atomic.Int64 }

func (r *countingRetry) Backoff(int) (time.Duration, bool) {
	r.n.Add(1)
	return 5 * time.Millisecond, true
}

// TestRefusedSubscriptionPacesByRetries: a waiter whose SUBSCRIBE Redis
// refuses (no channel right) attempts at its RetryStrategy's pace at once,
// instead of waiting a second for a confirmation that never comes; and it
// gets the lock once it is released.
func TestRefusedSubscriptionPacesByRetries(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	c, _ := aclUser(t, srv, "nosub", "resetchannels")
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), "nosub")
	mustAcquire(t, holder)
	retry := &countingRetry{}
	l := NewLocker(FromGoRedis(c))
	defer l.Close()
	waiter := l.NewLock("nosub", WithRetry(retry), WithWaitTimeout(time.Second))
	// With the holder on for the whole wait: a wait that sat out a second
	// for its subscription makes one or two attempts; paced by 5 ms, dozens.
	if err := waiter.AcquireWait(ctx); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("AcquireWait = %v; want ErrNotAcquired", err)
	}
	if n := retry.n.Load(); n < 5 {
		t.Errorf("%d attempts paced in a 1 s wait; want the RetryStrategy's pace", n)
	}
	got := make(chan error, 1)
	waiter = l.NewLock("nosub", WithRetry(retry))
	go func() { got <- waiter.AcquireWait(ctx) }()
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatalf("AcquireWait after the release: %v", err)
	}
	mustRelease(t, waiter)
}

// A scriptCase runs one script on one path, after setting up a key space
// in which other owners hold things.
type scriptCase struct {
	name     string
	script   *store.Script
	setup    map[string]string // lock key values, with a lease of a minute
	keys     []string
	args     []any
	commands []string // every command this path sends
	optional []string // those a refusal of which the script gets past
	writes   bool     // whether the path writes (so that a refused write fails it)
	alone    bool     // no other waiter in the fair queue
}

func scriptCases() []scriptCase {
	k, ab, fence, queue, waiters := "s", relatedName("s", "abandoned"), relatedName("s", "fence"), relatedName("s", "queue"), relatedName("s", "waiters")
	marker, broken, leader, hs := relatedName("s", "releases"), relatedName("s", "broken"), relatedName("s", "leader"), relatedName("s", "holders")
	return []scriptCase{
		{"acquire, free", store.Acquire, nil, []string{k, ab, hs}, []any{"me", 10000},
			[]string{"SET", "SISMEMBER"}, nil, true, false},
		{"acquire, free, fenced", store.Acquire, nil, []string{k, ab, hs, fence}, []any{"me", 10000},
			[]string{"SET", "SISMEMBER", "TIME", "GET"}, nil, true, false},
		{"acquire, held", store.Acquire, map[string]string{k: "other"}, []string{k, ab, hs}, []any{"me", 10000},
			[]string{"SET", "PTTL"}, nil, true, false},
		{"acquire, retried", store.Acquire, map[string]string{k: "me"}, []string{k, ab, hs, fence}, []any{"me", 10000},
			[]string{"SET", "PEXPIRE", "GET"}, nil, true, false},
		{"extend, own", store.Extend, map[string]string{k: "me"}, []string{k}, []any{"me", 10000},
			[]string{"GET", "PEXPIRE"}, nil, true, false},
		{"extend, another's", store.Extend, map[string]string{k: "other"}, []string{k}, []any{"me", 10000},
			[]string{"GET"}, nil, false, false},
		{"release, own", store.Release, map[string]string{k: "me"}, []string{k, marker, hs}, []any{"me", "ch"},
			[]string{"GET", "DEL", "SETRANGE", "PEXPIRE", "PUBLISH"}, []string{"SETRANGE", "PEXPIRE", "PUBLISH"}, true, false},
		{"release, another's", store.Release, map[string]string{k: "other"}, []string{k, marker, hs}, []any{"me", "ch"},
			[]string{"GET"}, nil, false, false},
		{"release, given up", store.Release, map[string]string{k: "other"}, []string{k, marker, hs, ab}, []any{"me", "ch", 60000},
			[]string{"SADD", "PTTL", "PEXPIRE", "GET"}, nil, true, false},
		{"fair acquire, join", store.FairAcquire, map[string]string{k: "other"}, []string{k, ab, queue, waiters, hs}, []any{"me", 10000, 10000},
			[]string{"SISMEMBER", "TIME", "GET", "PTTL", "ZRANGE", "ZADD", "ZREM", "HSET", "HDEL", "SET", "PEXPIRE"}, nil, true, false},
		{"fair acquire, free", store.FairAcquire, nil, []string{k, ab, queue, waiters, hs, fence}, []any{"me", 10000, 10000},
			[]string{"SISMEMBER", "TIME", "GET", "ZRANGE", "SET", "ZADD", "ZREM", "HSET", "HDEL", "PEXPIRE"}, nil, true, true},
		{"fair release, handoff", store.FairRelease, map[string]string{k: "me"}, []string{k, marker, queue, waiters, fence, hs}, []any{"me", "ch"},
			[]string{"GET", "TIME", "ZRANGE", "HGET", "ZREM", "HDEL", "SET", "DEL", "ZADD", "ZSCORE", "PEXPIRE", "SETRANGE", "PUBLISH"}, []string{"SETRANGE", "PUBLISH"}, true, false},
		{"fair release, alone", store.FairRelease, map[string]string{k: "me"}, []string{k, marker, queue, waiters, fence, hs}, []any{"me", "ch"},
			[]string{"GET", "TIME", "ZRANGE", "DEL", "SET", "ZADD", "ZREM", "ZSCORE", "HDEL", "PEXPIRE", "SETRANGE", "PUBLISH"}, []string{"SETRANGE", "PUBLISH"}, true, true},
		{"fair release, given up", store.FairRelease, map[string]string{k: "other"}, []string{k, marker, queue, waiters, fence, hs, ab}, []any{"me", "ch", 60000},
			[]string{"SADD", "PTTL", "PEXPIRE", "ZREM", "HDEL", "GET", "TIME", "SET", "DEL", "ZADD", "ZSCORE", "HGET"}, []string{"HGET"}, true, false},
		{"ttl", store.TTL, map[string]string{k: "me"}, []string{k, hs}, []any{"me"},
			[]string{"GET", "PTTL"}, nil, false, false},
		{"inspect", store.Inspect, map[string]string{k: "other"}, []string{k, fence, queue, waiters, hs}, nil,
			[]string{"TYPE", "GET", "TIME", "ZRANGE", "HGET", "PTTL", "PEXPIRETIME"}, []string{"PEXPIRETIME"}, false, false},
		{"break", store.Break, map[string]string{k: "other"}, []string{k, broken, hs}, []any{"", "ch", 60000, "call"},
			[]string{"HGET", "GET", "PTTL", "DEL", "HSET", "PEXPIRE", "PUBLISH"}, []string{"HSET", "PEXPIRE", "PUBLISH"}, true, false},
		// Elections.
		{"proclaim, leading", store.Proclaim, map[string]string{k: "me", leader: "me\n7\n1\nv"}, []string{k, leader}, []any{"me", "w", "ch", 7, 2},
			[]string{"GET", "SET", "PUBLISH"}, []string{"PUBLISH"}, true, false},
		{"proclaim, not leading", store.Proclaim, map[string]string{k: "other"}, []string{k, leader}, []any{"me", "w", "ch", 7, 1},
			[]string{"GET"}, nil, false, false},
		{"leader", store.Leader, map[string]string{k: "other", leader: "other\n7\n1\nv"}, []string{k, leader}, nil,
			[]string{"GET", "PTTL"}, nil, false, false},
		// Semaphores and shared locks: "zset <mark> <score> <holder>..." (see setup).
		{"permit acquire, free", store.PermitAcquire, nil, []string{k, ab, hs}, []any{"me", 10000, 2},
			[]string{"GET", "TIME", "ZADD", "PEXPIRE", "PTTL", "SISMEMBER", "DEL", "SET"}, nil, true, false},
		{"permit acquire, full", store.PermitAcquire, map[string]string{k: "zset " + store.PermitsMark + " -1 other"}, []string{k, ab, hs}, []any{"me", 10000, 1},
			[]string{"ZSCORE", "TIME", "SISMEMBER", "ZADD", "PEXPIRE", "PTTL", "ZCOUNT", "ZRANGEBYSCORE", "ZREM"}, nil, false, false},
		{"permit acquire, free, fenced", store.PermitAcquire, nil, []string{k, ab, hs, fence}, []any{"me", 10000, 2},
			[]string{"GET", "TIME", "SISMEMBER", "ZADD", "PEXPIRE", "PTTL", "SET", "DEL"}, nil, true, false},
		// Found by the black-box review: a refused attempt dropped the lapsed holder.
		{"permit acquire, full of a lapsed holder", store.PermitAcquire, map[string]string{k: "zset " + store.PermitsMark + " -1 -lapsed"}, []string{k, ab, hs}, []any{"me", 10000, 1},
			[]string{"ZSCORE", "TIME", "SISMEMBER", "ZADD", "PEXPIRE", "PTTL", "ZCOUNT", "ZRANGEBYSCORE", "ZREM"}, nil, true, false},
		{"fair acquire, a permit, join", store.FairAcquire, map[string]string{k: "zset " + store.PermitsMark + " -1 other"}, []string{k, ab, queue, waiters, hs}, []any{"me", 10000, 10000, 1},
			[]string{"SISMEMBER", "TIME", "GET", "ZSCORE", "ZCOUNT", "ZADD", "PTTL", "ZREM", "HSET", "HDEL", "SET", "PEXPIRE", "ZRANGEBYSCORE", "ZRANGE"}, nil, true, false},
		{"fair release, a permit, handoff", store.FairRelease, map[string]string{k: "zset " + store.PermitsMark + " -1 me"}, []string{k, marker, queue, waiters, fence, hs}, []any{"me", "ch"},
			[]string{"GET", "ZSCORE", "TIME", "ZRANGE", "HGET", "ZREM", "HDEL", "ZADD", "PEXPIRE", "PTTL", "SET", "DEL", "ZCOUNT", "ZRANGEBYSCORE", "SETRANGE", "PUBLISH"}, []string{"SETRANGE", "PUBLISH"}, true, false},
		{"shared acquire, held by a lock", store.PermitAcquire, map[string]string{k: "other"}, []string{k, ab, hs}, []any{"me", 10000, 0},
			[]string{"GET", "PTTL"}, nil, false, false},
		{"acquire, shared, waiting", store.Acquire, map[string]string{k: "zset " + store.SharedMark + " 0 other"}, []string{k, ab, hs}, []any{"me", 10000, 20000},
			[]string{"SET", "ZCOUNT", "DEL", "ZADD", "PTTL", "SISMEMBER", "TIME", "ZRANGEBYSCORE", "ZREM"}, nil, true, false},
		{"acquire, shared, left", store.Acquire, map[string]string{k: "zset " + store.SharedMark + " 0"}, []string{k, ab, hs}, []any{"me", 10000},
			[]string{"SET", "ZCOUNT", "DEL", "ZADD", "PTTL", "SISMEMBER", "TIME", "ZRANGEBYSCORE", "ZREM"}, nil, true, false},
		{"extend, a permit", store.ExtendHolders, map[string]string{k: "zset " + store.PermitsMark + " -2 me"}, []string{k, hs}, []any{"me", 10000},
			[]string{"GET", "ZSCORE", "TIME", "PEXPIRE", "PTTL", "ZADD"}, nil, true, false},
		{"release, a permit", store.Release, map[string]string{k: "zset " + store.PermitsMark + " -2 other me"}, []string{k, marker, hs}, []any{"me", "ch"},
			[]string{"GET", "ZSCORE", "ZCOUNT", "ZREM", "SETRANGE", "PEXPIRE", "PUBLISH"}, []string{"SETRANGE", "PEXPIRE", "PUBLISH"}, true, false},
		{"release, the last share", store.Release, map[string]string{k: "zset " + store.SharedMark + " 0 me"}, []string{k, marker, hs}, []any{"me", "ch"},
			[]string{"GET", "ZSCORE", "ZCOUNT", "TIME", "PEXPIRE", "DEL", "ZREM", "SETRANGE", "PUBLISH"}, []string{"SETRANGE", "PUBLISH"}, true, false},
		{"ttl, a permit", store.TTL, map[string]string{k: "zset " + store.PermitsMark + " -2 me"}, []string{k, hs}, []any{"me"},
			[]string{"GET", "ZSCORE", "TIME"}, nil, false, false},
		{"inspect, a semaphore", store.Inspect, map[string]string{k: "zset " + store.PermitsMark + " -2 other"}, []string{k, fence, queue, waiters, hs}, nil,
			[]string{"TYPE", "TIME", "ZRANGE", "PTTL", "PEXPIRETIME"}, []string{"PEXPIRETIME"}, false, false},
		{"fair acquire, a share, join", store.FairAcquire, map[string]string{k: "other"}, []string{k, ab, queue, waiters, hs}, []any{"me", 10000, 10000, 0},
			[]string{"GET", "SET", "TIME", "PTTL", "PEXPIRE", "ZADD", "ZREM", "ZRANGE", "HSET", "HDEL", "SISMEMBER"}, nil, true, false},
		{"fair acquire, a share, free", store.FairAcquire, map[string]string{k: "zset " + store.SharedMark + " 0 other"}, []string{k, ab, queue, waiters, hs, fence}, []any{"me", 10000, 10000, 0},
			[]string{"GET", "SET", "TIME", "PTTL", "PEXPIRE", "ZADD", "ZREM", "ZSCORE", "ZRANGE", "ZRANK", "HSET", "HDEL", "SISMEMBER"}, nil, true, true},
		{"fair acquire, a share, behind a writer", store.FairAcquire, map[string]string{k: "zset " + store.SharedMark + " 0 other"}, []string{k, ab, queue, waiters, hs}, []any{"me", 10000, 10000, 0},
			[]string{"GET", "SET", "TIME", "PTTL", "PEXPIRE", "ZADD", "ZREM", "ZSCORE", "ZRANGE", "ZRANK", "HGET", "HSET", "HDEL", "SISMEMBER"}, nil, true, false},
		{"fair acquire, exclusive, shares hold", store.FairAcquire, map[string]string{k: "zset " + store.SharedMark + " 0 other"}, []string{k, ab, queue, waiters, hs}, []any{"me", 10000, 10000},
			[]string{"GET", "SET", "TIME", "PEXPIRE", "ZADD", "ZREM", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "HSET", "HDEL", "SISMEMBER"}, nil, true, false},
		{"fair acquire, exclusive, shares lapsed", store.FairAcquire, map[string]string{k: "zset " + store.SharedMark + " 0 -other"}, []string{k, ab, queue, waiters, hs}, []any{"me", 10000, 10000},
			[]string{"GET", "SET", "TIME", "PEXPIRE", "ZADD", "ZREM", "ZCOUNT", "ZRANGE", "HSET", "HDEL", "SISMEMBER"}, nil, true, true},
		{"fair release, the last share, handoff", store.FairRelease, map[string]string{k: "zset " + store.SharedMark + " 0 me"}, []string{k, marker, queue, waiters, fence, hs}, []any{"me", "ch"},
			[]string{"GET", "SET", "DEL", "TIME", "PTTL", "PEXPIRE", "ZADD", "ZREM", "ZSCORE", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "HGET", "HDEL", "SETRANGE", "PUBLISH"}, []string{"SETRANGE", "PUBLISH"}, true, false},
		{"fair release, a share, others hold", store.FairRelease, map[string]string{k: "zset " + store.SharedMark + " 0 me other"}, []string{k, marker, queue, waiters, fence, hs}, []any{"me", "ch"},
			[]string{"GET", "SET", "DEL", "TIME", "PTTL", "PEXPIRE", "ZADD", "ZREM", "ZSCORE", "ZCOUNT", "ZRANGE", "ZRANGEBYSCORE", "HGET", "HDEL", "SETRANGE", "PUBLISH"}, []string{"SETRANGE", "PUBLISH"}, true, false},
		{"fair release, handoff to a share waiter", store.FairRelease, map[string]string{k: "me"}, []string{k, marker, queue, waiters, fence, hs}, []any{"me", "ch"},
			[]string{"GET", "SET", "DEL", "TIME", "PEXPIRE", "ZADD", "ZREM", "ZSCORE", "ZRANGE", "HGET", "HDEL", "SETRANGE", "PUBLISH"}, []string{"SETRANGE", "PUBLISH"}, true, false},
		{"break, a holder", store.Break, map[string]string{k: "zset " + store.PermitsMark + " -2 other me"}, []string{k, broken, hs}, []any{"other", "ch", 60000, "call"},
			[]string{"HGET", "GET", "PTTL", "ZSCORE", "ZCOUNT", "ZREM", "HSET", "PEXPIRE", "PUBLISH"}, []string{"HSET", "PEXPIRE", "PUBLISH"}, true, false},
	}
}

// keySpace is what every key holds: its DUMP and whether it expires.
func keySpace(t *testing.T, admin *redis.Client) map[string]string {
	ctx := context.Background()
	all := map[string]string{}
	for _, k := range admin.Keys(ctx, "*").Val() {
		ttl := admin.PTTL(ctx, k).Val()
		all[k] = fmt.Sprintf("%q expires:%v", admin.Dump(ctx, k).Val(), ttl != -1)
	}
	return all
}

// TestEveryScriptUnderEveryRefusal runs every script, on each of its
// paths, with Redis refusing each command the path sends (by ACL), and
// refusing writes (memory full, a replica, a failed save). Each run is
// an error naming the refused command, or (for what a script can do
// without: a wake-up, a record) the script's usual reply; and nothing of
// another owner changes: the lock key of another, the other waiter in the
// queue, the counter. A run that fails leaves nothing of its own either,
// but keys that expire.
func TestEveryScriptUnderEveryRefusal(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(srv.Port)).Client(t)
	waitFor(t, 10*time.Second, "the replica in sync", func() bool {
		return strings.Contains(replica.Info(ctx, "replication").Val(), "master_link_status:up")
	})
	setup := func(c scriptCase) {
		must(t, admin.FlushAll(ctx).Err())
		for key, v := range c.setup {
			f := strings.Fields(v)
			if len(f) < 3 || f[0] != "zset" {
				must(t, admin.Set(ctx, key, v, time.Minute).Err())
				continue
			}
			// The key names its kind; its holders are a related key (holders.lua).
			must(t, admin.Set(ctx, key, f[1], time.Minute).Err())
			holders := relatedName(key, "holders")
			score, _ := strconv.ParseFloat(f[2], 64)
			must(t, admin.ZAdd(ctx, holders, redis.Z{Score: score, Member: f[1]}).Err())
			for _, holder := range f[3:] {
				end := time.Now().Add(time.Minute)
				if lapsed, ok := strings.CutPrefix(holder, "-"); ok { // a holder whose lease ended
					holder, end = lapsed, time.Now().Add(-time.Second)
				}
				must(t, admin.ZAdd(ctx, holders, redis.Z{Score: float64(end.UnixMilli()), Member: holder}).Err())
			}
			must(t, admin.PExpire(ctx, holders, time.Minute).Err())
		}
		if c.alone {
			return
		}
		// Another waiter, live, in the fair queue; a counter; a give-up.
		queue, waiters := relatedName("s", "queue"), relatedName("s", "waiters")
		now := time.Now().UnixMilli()
		must(t, admin.ZAdd(ctx, queue, redis.Z{Score: 1, Member: "w1"}).Err())
		wants := "5000"
		if strings.Contains(c.name, "share waiter") {
			wants += "s" // w1 waits for a share (fair_acquire.lua)
		}
		must(t, admin.HSet(ctx, waiters, "w1", fmt.Sprintf("%d %s", now+60000, wants)).Err())
		must(t, admin.PExpire(ctx, queue, time.Minute).Err())
		must(t, admin.PExpire(ctx, waiters, time.Minute).Err())
		must(t, admin.Set(ctx, relatedName("s", "fence"), "7", 0).Err())
		must(t, admin.SAdd(ctx, relatedName("s", "abandoned"), "gone").Err())
		must(t, admin.PExpire(ctx, relatedName("s", "abandoned"), time.Minute).Err())
	}
	// others reads what belongs to others: all but what the case may
	// change of its own on a success.
	others := func() map[string]string {
		all := keySpace(t, admin)
		for k := range all {
			if k == relatedName("s", "releases") {
				delete(all, k)
			}
		}
		return all
	}
	runs := 0
	for _, c := range scriptCases() {
		for _, command := range c.commands {
			setup(c)
			before := others()
			user, _ := aclUser(t, srv, "u", "-"+strings.ToLower(command))
			_, err := store.New(FromGoRedis(user)).Run(ctx, c.script, c.keys, c.args...)
			runs++
			what := fmt.Sprintf("%s, -%s", c.name, command)
			if slices.Contains(c.optional, command) {
				if err != nil {
					t.Errorf("%s: %v; want the script to get past it", what, err)
				}
				continue
			}
			refusedBy(t, what, err, command)
			if after := others(); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("%s: the key space changed:\n before %v\n after  %v", what, before, after)
			}
		}
		for _, kind := range serverRefusals() {
			setup(c)
			before := others()
			var err error
			if kind.name == "READONLY" { // a replica all along: quicker than a demotion each time
				must(t, admin.Do(ctx, "WAIT", 1, 0).Err())
				_, err = store.New(FromGoRedis(replica)).Run(ctx, c.script, c.keys, c.args...)
			} else {
				kind.set(t, srv)
				_, err = store.New(FromGoRedis(srv.Client(t))).Run(ctx, c.script, c.keys, c.args...)
				kind.undo(t, srv)
			}
			runs++
			what := fmt.Sprintf("%s, %s", c.name, kind.name)
			refusable := c.writes && (kind.name != "OOM" || denyOOMFirst[c.name])
			if !refusable {
				if err != nil {
					t.Errorf("%s: %v; want it through", what, err)
				}
				continue
			}
			refusedBy(t, what, err, "")
			if err != nil && !strings.Contains(err.Error(), kind.name) {
				t.Errorf("%s: %v does not say %s", what, err, kind.name)
			}
			if after := others(); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Errorf("%s: the key space changed:\n before %v\n after  %v", what, before, after)
			}
		}
	}
	t.Logf("%d runs of %d script paths", runs, len(scriptCases()))
}

// denyOOMFirst names the paths whose first write is one Redis refuses
// when memory is full (SET, SADD, ZADD, HSET); DEL, PEXPIRE and ZREM it
// lets through, and after one of them (whatever it changed) everything:
// a fair waiter's give-up leaves the queue first, and so is recorded.
var denyOOMFirst = map[string]bool{
	"proclaim, leading": true, "acquire, free": true, "acquire, free, fenced": true, "acquire, held": true, "acquire, retried": true,
	"release, given up": true, "fair acquire, join": true, "fair acquire, free": true,
	"permit acquire, free": true, "permit acquire, free, fenced": true, "fair acquire, a permit, join": true, "acquire, shared, waiting": true, "acquire, shared, left": true,
	"fair acquire, exclusive, shares lapsed": true, "fair acquire, a share, join": true, "fair acquire, a share, free": true, "fair acquire, a share, behind a writer": true, "fair acquire, exclusive, shares hold": true,
}

// refusalRound is one fault-table round of refusals: for each store, n
// holders acquire before inject makes Redis refuse, then n newcomers try to
// acquire and the holders release. truth is a client of the server that
// has the data afterwards (the new primary after a failover). A violation
// is an acquisition reported that truth does not show, a release reported
// as done while truth still shows the key, or one reported failed while
// truth shows it gone, and an error that is not a refusal saying code
// (naming a command, for "").
func refusalRound(t *testing.T, stores map[string]Scripter, inject func(), truth func() *redis.Client, code string, n int) (runs, refusals, violations int64) {
	t.Helper()
	ctx := context.Background()
	type held struct {
		rl    *RedisLock
		owner string
	}
	var holders []held
	var lockers []*Locker
	for name, st := range stores {
		l := NewLocker(st, WithExpiry(time.Minute))
		lockers = append(lockers, l)
		for i := range n {
			rl := l.NewLock(fmt.Sprintf("refused:%s:held:%d", name, i))
			mustAcquire(t, rl)
			holders = append(holders, held{rl, rl.Owner()})
		}
	}
	inject()
	bad := func(what string, err error) {
		var e redis.Error
		var r *store.Refusal
		switch {
		case code == "" && errors.As(err, &r) && errors.As(err, &e) && r.Key != "": // names the command
			refusals++
		case code != "" && errors.Is(err, ErrRefused) && errors.As(err, &e) && strings.Contains(err.Error(), code):
			refusals++
		case errors.Is(err, breaker.ErrServiceUnavailable): // go-zero's breaker, open: nothing sent
		default:
			violations++
			t.Errorf("%s: %v; want a refusal saying %s", what, err, code)
		}
	}
	var newcomers []*RedisLock
	for i, l := range lockers {
		for j := range n {
			rl := l.NewLock(fmt.Sprintf("refused:%d:new:%d", i, j))
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ok, err := rl.AcquireCtx(cctx)
			cancel()
			runs++
			switch {
			case ok:
				newcomers = append(newcomers, rl)
			case err != nil:
				bad("Acquire", err)
			}
		}
	}
	var released []bool
	var errs []error
	for _, h := range holders {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := h.rl.ReleaseCtx(cctx)
		cancel()
		runs++
		released = append(released, ok && err == nil)
		errs = append(errs, err)
	}
	// The truth, once the fault is over where it ends (a load).
	rc := truth()
	for _, rl := range newcomers {
		if v := rc.Get(ctx, rl.Key()).Val(); v != rl.Owner() || v == "" {
			violations++
			t.Errorf("Acquire(%q) reported the lock taken; Redis holds %q", rl.Key(), v)
		}
		_, _ = rl.Release()
	}
	for i, h := range holders {
		gone := rc.Get(ctx, h.rl.Key()).Val() != h.owner
		switch {
		case released[i] && !gone:
			violations++
			t.Errorf("Release(%q) reported done; Redis still holds it", h.rl.Key())
		case !released[i] && gone:
			violations++
			t.Errorf("Release(%q) = %v, and Redis released it", h.rl.Key(), errs[i])
		case !released[i]:
			bad("Release", errs[i])
		}
	}
	for _, l := range lockers {
		_ = l.Close() // what could not be released expires with its lease
	}
	return runs, refusals, violations
}

// TestFaultRefusals: the fault table's rows for a Redis that refuses.
func TestFaultRefusals(t *testing.T) {
	ctx := context.Background()
	const n = 5
	kinds := serverRefusals()
	for _, kind := range kinds[:3] { // OOM, READONLY, MISCONF
		t.Run(kind.name, func(t *testing.T) {
			srv := redisserver.Start(t)
			stores := map[string]Scripter{"go-redis": FromGoRedis(srv.Client(t)), "go-zero": goZeroStore(t, srv.Addr)}
			truth := func() *redis.Client { return srv.Client(t) }
			inject := func() { kind.set(t, srv) }
			var row faultRow
			switch kind.name {
			case "OOM":
				row = faultRow{Case: "18. memory full", Injection: "maxmemory below used memory, noeviction, with locks held"}
			case "READONLY":
				// A failover that the lock client does not see: the replica
				// is promoted, and the old primary, still its server, gets
				// REPLICAOF.
				replica := redisserver.Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(srv.Port))
				inject = func() {
					rc := replica.Client(t)
					// WAIT covers its own connection's writes: a write first,
					// or it returns at once, the replica maybe still syncing
					// (Valkey, 2 runs in 16).
					c := srv.Client(t).Conn() // one connection
					defer c.Close()
					must(t, c.Set(ctx, "refused:synced", "1", 0).Err())
					if n, err := c.Do(ctx, "WAIT", 1, 5000).Int(); n != 1 || err != nil {
						t.Fatalf("WAIT 1 = %d, %v", n, err)
					}
					must(t, rc.SlaveOf(ctx, "NO", "ONE").Err())
					must(t, srv.Client(t).SlaveOf(ctx, "127.0.0.1", fmt.Sprint(replica.Port)).Err())
				}
				truth = func() *redis.Client { return replica.Client(t) }
				row = faultRow{Case: "19. primary demoted under its clients", Injection: "the replica promoted, the old primary given REPLICAOF while the lock clients stay connected to it"}
			case "MISCONF":
				row = faultRow{Case: "20. failed save", Injection: "a BGSAVE that fails, stop-writes-on-bgsave-error yes"}
			}
			runs, refusals, violations := refusalRound(t, stores, inject, truth, kind.name, n)
			row.Promise = "no acquisition reported that Redis did not make; a release that happened reported as one; errors match ErrRefused and say " + kind.name
			row.Runs, row.Faults, row.Violations = runs, refusals, violations
			if refusals == 0 {
				t.Error("no call was refused: the fault was not injected")
			}
			recordFault(t, row)
		})
	}
	t.Run("ACL", func(t *testing.T) {
		var runs, faults, violations int64
		for _, rules := range [][]string{{"-set"}, {"-sismember"}, {"-del"}, {"-pexpire"}, {"-setrange"}, {"resetchannels"}} {
			srv := redisserver.Start(t)
			c, z := aclUser(t, srv, "u", "+@all")
			inject := func() { must(t, srv.Client(t).Do(ctx, append([]any{"ACL", "SETUSER", "u"}, toAny(rules)...)...).Err()) }
			r, f, v := refusalRound(t, map[string]Scripter{"go-redis": FromGoRedis(c), "go-zero": z}, inject,
				func() *redis.Client { return srv.Client(t) }, "", n)
			runs, faults, violations = runs+r, faults+f, violations+v
		}
		if faults == 0 {
			t.Error("no call was refused: the faults were not injected")
		}
		recordFault(t, faultRow{Case: "21. ACL denials", Injection: "an ACL that takes away SET, SISMEMBER, DEL, PEXPIRE, SETRANGE or every channel, with locks held",
			Promise: "no acquisition reported that Redis did not make; a release that happened reported as one (also without PUBLISH); errors match ErrRefused and name the command",

			Runs: runs, Faults: faults, Violations: violations})
	})
	t.Run("LOADING", func(t *testing.T) {
		srv := redisserver.Start(t, "--key-load-delay", "20", "--loading-process-events-interval-bytes", "65536")
		admin := srv.Client(t)
		must(t, admin.Do(ctx, "DEBUG", "POPULATE", 100000).Err())
		stores := map[string]Scripter{"go-redis": FromGoRedis(srv.Client(t)), "go-zero": goZeroStore(t, srv.Addr)}
		inject := func() {
			must(t, admin.Save(ctx).Err())
			srv.RestartLoading(t)
		}
		truth := func() *redis.Client {
			c := srv.Client(t)
			waitFor(t, 30*time.Second, "the data loaded", func() bool { return c.Ping(ctx).Err() == nil })
			return c
		}
		runs, refusals, violations := refusalRound(t, stores, inject, truth, "LOADING", n)
		if refusals == 0 {
			t.Error("no call was refused: the load was over before the calls")
		}
		recordFault(t, faultRow{Case: "22. restart still loading", Injection: "kill -9 and restart with 100,000 keys to load (20 µs a key), locks held in the saved data",
			Promise: "no acquisition reported that Redis did not make; a release that happened reported as one; errors match ErrRefused and say LOADING",
			Runs:    runs, Faults: refusals, Violations: violations})
	})
}

// TestDocumentedACLIsEnough: the ACL docs/operating.md gives (every
// command but the dangerous ones, the lock's keys and related keys, its
// channels) lets every call through: plain, fair and fenced locks on keys
// of each form, fenced and fair semaphores, waiting, Inspect, Break and
// Watch, with go-redis and go-zero's store.
func TestDocumentedACLIsEnough(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	must(t, srv.Client(t).Do(ctx, "ACL", "SETUSER", "app", "reset", "on", ">pw", "~app:*", "~{app:*", "~{*}~app:*", "&app:*", "&{app:*", "&{*}~app:*", "+@all", "-@dangerous").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "app", Password: "pw"})
	defer c.Close()
	z := goZeroStoreOf(t, zredis.RedisConf{Host: srv.Addr, Type: zredis.NodeType, User: "app", Pass: "pw", DisableIdentity: true})
	for name, st := range map[string]Scripter{"go-redis": FromGoRedis(c), "go-zero": z} {
		for i, opts := range [][]Option{{WithFencing()}, {WithFairness(), WithFencing()}, {WithFencing()}, {WithFairness()}, {WithFencing()}, {WithFairness()},
			{WithPermits(1), WithFencing()}, {WithPermits(1), WithFairness(), WithFencing()}, // and a semaphore (issue 28),
			{WithFairness(), WithFencing()}, {WithFairness()}} { // and a fair share behind an exclusive holder
			key := []string{"app:1", "app:{job}", "app:a}b", "app:pool", "app:rw"}[i/2] // plain, with a hash tag, with a stray '}' (round 20)
			l := NewLocker(st, append(opts, WithPubSub(c))...)
			var shared []Option
			if key == "app:rw" {
				shared = []Option{WithShared()}
			}
			holder, waiter := l.NewLock(key), l.NewLock(key, shared...)
			mustAcquire(t, holder)
			mustAcquire(t, holder) // a re-entry
			got := make(chan error, 1)
			go func() { got <- waiter.AcquireWait(ctx) }()
			waitFor(t, 10*time.Second, "the waiter in line", func() bool {
				st, err := holder.Inspect(ctx)
				return err == nil && (queuedHere(waiter) || st.Waiters == 1)
			})
			if _, err := holder.TTL(ctx); err != nil {
				t.Errorf("%s: TTL: %v", name, err)
			}
			mustRelease(t, holder)
			mustRelease(t, holder)
			if err := <-got; err != nil {
				t.Fatalf("%s: AcquireWait: %v", name, err)
			}
			if st, err := holder.Break(ctx, waiter.Owner()); err != nil || !st.Held {
				t.Errorf("%s: Break = %+v, %v", name, st, err)
			}
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			if err := holder.Watch(wctx, 10*time.Millisecond, func(Status) {}); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: Watch: %v", name, err)
			}
			cancel()
			_, _ = waiter.Release()
			if !l.wake.Unheard(key) || l.wake.Hubs() > 1 {
				t.Errorf("%s, %s: a wake-up was refused", name, key)
			}
			must(t, l.Close())
		}
	}
}

// TestRefusedWakeUpWakesTheLockersOwnWaiters: a release whose PUBLISH
// Redis refuses (here the command; the channel is allowed, so the waiter
// subscribes) wakes the waiters of its own Locker at once, instead of
// leaving them to the holder's lease (black-box round 19, V1).
func TestRefusedWakeUpWakesTheLockersOwnWaiters(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	c, _ := aclUser(t, srv, "nopublish", "-publish")
	for _, opts := range [][]Option{nil, {WithFairness()}} {
		l := NewLocker(FromGoRedis(c), append(opts, WithExpiry(20*time.Second))...)
		holder, waiter := l.NewLock("unheard"), l.NewLock("unheard")
		mustAcquire(t, holder)
		got := make(chan error, 1)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second) // half the lease
		go func() { got <- waiter.AcquireWait(wctx) }()
		waitFor(t, 10*time.Second, "the waiter subscribed and in line", func() bool {
			_, confirmed := l.wake.Waiting(waiter, waiter.opts.pubsub, waiter.names.channel)
			st, err := holder.Inspect(ctx)
			return confirmed && (queuedHere(waiter) || err == nil && st.Waiters == 1)
		})
		mustRelease(t, holder)
		if err := <-got; err != nil {
			t.Fatalf("%d options: the waiter was not woken by its Locker: %v", len(opts), err)
		}
		cancel()
		mustRelease(t, waiter)
		must(t, l.Close())
	}
}

// TestFairWaiterRefusedForMemoryLeavesTheQueue: a fair waiter whose
// attempt Redis refuses for memory returns the refusal and leaves the
// queue before it returns, so that the next release hands the lock to a
// live waiter (black-box round 19, V2: it stayed, and the lock went to
// it).
func TestFairWaiterRefusedForMemoryLeavesTheQueue(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	holder := NewRedisLock(FromGoRedis(srv.Client(t)), "oomq", WithFairness(), WithExpiry(3*time.Second))
	mustAcquire(t, holder)
	waiter := NewRedisLock(FromGoRedis(srv.Client(t)), "oomq", WithFairness(), WithExpiry(3*time.Second))
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(ctx) }()
	queue := relatedName("oomq", "queue")
	waitFor(t, 10*time.Second, "the waiter queued", func() bool { return admin.ZCard(ctx, queue).Val() == 1 })
	kind := serverRefusals()[0] // OOM
	kind.set(t, srv)
	err := <-got // its next refresh, within lease/3
	kind.undo(t, srv)
	refusedBy(t, "the fair waiter's attempt", err, "")
	if n := admin.ZCard(ctx, queue).Val(); n != 0 {
		t.Errorf("%d waiters left in the queue after the refused wait returned", n)
	}
	mustRelease(t, holder)
}

// TestReadsAnswerDuringClientPauseWrite: Inspect and TTL send read-only
// scripts, which CLIENT PAUSE WRITE lets through, where EVALSHA would wait
// for the whole pause (issue 25).
func TestReadsAnswerDuringClientPauseWrite(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	rl := NewRedisLock(FromGoRedis(srv.Client(t)), "paused", WithExpiry(time.Minute))
	mustAcquire(t, rl)
	must(t, srv.Client(t).Do(ctx, "CLIENT", "PAUSE", 3000, "WRITE").Err())
	defer srv.Client(t).Do(ctx, "CLIENT", "UNPAUSE")
	cctx, cancel := context.WithTimeout(ctx, time.Second) // a third of the pause
	defer cancel()
	if st, err := rl.Inspect(cctx); err != nil || st.Owner != rl.Owner() {
		t.Errorf("Inspect during the pause = %+v, %v", st, err)
	}
	if left, err := rl.TTL(cctx); err != nil || left <= 0 {
		t.Errorf("TTL during the pause = %v, %v", left, err)
	}
	must(t, srv.Client(t).Do(ctx, "CLIENT", "UNPAUSE").Err())
	mustRelease(t, rl)
}

// Found by the black-box review of issue 26: two locks of one Locker, the
// user's ACL then losing a's key only. The renewal batch of both was
// refused whole (NOPERM), so b lost its hold too, with an error naming a's
// key. Each lease of a batch refused whole is renewed on its own now: b
// keeps its hold, a's renewals fail, each naming its own key.
func TestBatchWithOneKeyDeniedKeepsTheOthers(t *testing.T) {
	srv := redisserver.Start(t)
	c, _ := aclUser(t, srv, "batch")
	// A lease of 2 s: b's lone renewal has over a second to get through on
	// a loaded machine.
	l := NewLocker(FromGoRedis(c), WithExpiry(2*time.Second))
	defer l.Close()
	a, b := l.NewLock("batch:a"), l.NewLock("batch:b")
	mustAcquire(t, a)
	mustAcquire(t, b)
	must(t, srv.Client(t).Do(context.Background(), "ACL", "SETUSER", "batch", "resetkeys", "~batch:b", "~{batch:b}*").Err())
	aDone := a.Done()
	select { // a's lease runs out unrenewed; b's renewals went on meanwhile
	case <-aDone:
	case <-time.After(20 * time.Second):
		t.Fatal("a's hold outlived its lease without a renewal")
	}
	if err := a.Err(); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), `"batch:a"`) {
		t.Errorf("a's hold ended with %v; want a refusal naming batch:a", err)
	}
	if err := b.Err(); err != nil || b.Holds() != 1 {
		t.Fatalf("b: Err %v, Holds %d; want its hold kept", err, b.Holds())
	}
	if ttl := srv.Client(t).PTTL(context.Background(), "batch:b").Val(); ttl <= 0 {
		t.Errorf("b's key has %v left", ttl)
	}
	mustRelease(t, b)
}

// Found by the black-box reviews of issue 26: a release that Redis let
// delete the key but not write its record of releases (an ACL without
// SETRANGE or PEXPIRE, an outsider's list under the record's name) went
// unrecorded, unsaid; refusing such releases instead broke releases under
// an ACL without GETRANGE (their retries), and wrote the record of a
// release whose DEL was refused. A release deletes the key first and
// records it after; what Redis refuses of the record goes unrecorded, as
// docs/semantics.md says: the release is a release, its retry a loss, and
// an outsider's value is left as it was. A refused DEL changes nothing.
func TestReleaseWithoutItsRecord(t *testing.T) {
	ctx := context.Background()
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	user := func(name string, rules ...string) func(string) *redis.Client {
		return func(string) *redis.Client { c, _ := aclUser(t, srv, name, rules...); return c }
	}
	for _, c := range []struct {
		name  string
		setup func(key string) *redis.Client
	}{
		{"-setrange", user("norange", "-setrange")},
		{"-pexpire", user("noexpire", "-pexpire")},
		{"-getrange", user("nogetrange", "-getrange")},
		{"a list as the record", func(key string) *redis.Client {
			must(t, admin.RPush(ctx, relatedName(key, "releases"), "x").Err())
			return admin
		}},
	} {
		for _, fair := range []bool{false, true} {
			if fair && c.name == "-pexpire" {
				continue // a fair acquisition needs PEXPIRE itself
			}
			key := fmt.Sprintf("norecord:%s:%v", c.name, fair)
			opts := []Option{WithPubSub(nil)}
			if fair {
				opts = append(opts, WithFairness())
			}
			client := c.setup(key)
			before := admin.Type(ctx, relatedName(key, "releases")).Val()
			rl := NewRedisLock(releaseRetried{FromGoRedis(client), func(string) {}}, key, opts...)
			mustAcquire(t, rl)
			ok, err := rl.Release() // run twice: the first reply lost
			recorded := c.name == "-getrange"
			if ok != recorded || !recorded && !errors.Is(err, ErrLockLost) || admin.Exists(ctx, key).Val() != 0 {
				t.Errorf("%s, fair %v: a retried release = %v, %v, key exists %v; want %v and the key gone",
					c.name, fair, ok, err, admin.Exists(ctx, key).Val(), recorded)
			}
			if after := admin.Type(ctx, relatedName(key, "releases")).Val(); !recorded && after != before {
				t.Errorf("%s, fair %v: the record's name holds a %s, was %s", c.name, fair, after, before)
			}
		}
	}
	// A refused DEL: nothing changed, no record of it.
	c, _ := aclUser(t, srv, "nodel", "-del")
	rl := NewRedisLock(FromGoRedis(c), "norecord:del")
	mustAcquire(t, rl)
	_, err := rl.Release()
	refusedBy(t, "-del", err, "DEL")
	if admin.Exists(ctx, relatedName("norecord:del", "releases")).Val() != 0 || admin.Get(ctx, "norecord:del").Val() == "" {
		t.Error("-del: the release's record was written, or the key deleted")
	}
}

// A user without SISMEMBER and DEL takes a free key with SET NX, is
// refused the check of given-up attempts, and cannot give the key back:
// the acquisition is a refusal naming SISMEMBER that says the key is left
// to expire, and the key expires within the lease. Without DEL alone, a
// plain lock is taken and its release refused (docs/operating.md). Both
// through the client and through its AutoPipeliner (found by the black-box
// review of issue 37).
func TestWithoutDELAndSISMEMBER(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	both, _ := aclUser(t, srv, "nodelsis", "-del", "-sismember")
	nodel, _ := aclUser(t, srv, "nodel", "-del")
	for name, s := range map[string]redis.Scripter{"client": both, "AutoPipeliner": autoPipeline(t, both)} {
		key := "nodelsis:" + name
		ok, err := NewRedisLock(FromGoRedis(s), key, WithExpiry(2*time.Second)).Acquire()
		if ok || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "SISMEMBER") || !strings.Contains(err.Error(), "left to expire") {
			t.Fatalf("%s: Acquire = %v, %v", name, ok, err)
		}
		if ttl := admin.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 2*time.Second {
			t.Fatalf("%s: the key left has PTTL %v, not within its lease", name, ttl)
		}
	}
	for name, s := range map[string]redis.Scripter{"client": nodel, "AutoPipeliner": autoPipeline(t, nodel)} {
		rl := NewRedisLock(FromGoRedis(s), "nodel:"+name, WithExpiry(2*time.Second))
		mustAcquire(t, rl)
		if ok, err := rl.Release(); ok || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "DEL") {
			t.Fatalf("%s: Release = %v, %v", name, ok, err)
		}
		if admin.Get(ctx, "nodel:"+name).Val() != holderID(rl) {
			t.Fatalf("%s: a refused release changed the key", name)
		}
	}
}
