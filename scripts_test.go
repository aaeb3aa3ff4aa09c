package redislock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
	"github.com/redislock/redislock/internal/store"
)

// TestScriptsDeclareEveryKey: every key a script touches is passed in KEYS
// (Redis requires it; ElastiCache Serverless, Dragonfly and proxies refuse
// or misroute scripts that do not). Each command a script sends, through
// call.lua's call and get or through redis.pcall, names its key as
// KEYS[...] itself, never as a name built from ARGV or a reply; the only
// commands without a key are TIME and PUBLISH (a channel). call.lua's own
// redis.pcall takes the command and key its callers give.
func TestScriptsDeclareEveryKey(t *testing.T) {
	sends := regexp.MustCompile(`(redis\.p?call|\bcall|\bneed|pcall\(call,)\(?\s*"([A-Za-z]+)"\s*(?:,\s*([^,)]*))?|\bget\(\s*([^,)]*)`)
	any := regexp.MustCompile(`redis\.p?call\(|\bcall\(|\bneed\(|\bget\(|pcall\(call,`)
	for name, source := range scriptSources() {
		if name == "call.lua" {
			continue
		}
		code := regexp.MustCompile(`(?m)--.*$`).ReplaceAllString(source, "")
		found := sends.FindAllStringSubmatch(code, -1)
		if len(found) == 0 {
			t.Errorf("%s: no command found", name)
		}
		for _, c := range found {
			cmd, key := strings.ToUpper(c[2]), strings.TrimSpace(c[3])
			if c[4] != "" {
				cmd, key = "GET", strings.TrimSpace(c[4])
			}
			switch {
			case cmd == "TIME" || cmd == "PUBLISH":
			case !strings.HasPrefix(key, "KEYS["):
				t.Errorf("%s: %s touches %q, which is not one of KEYS", name, cmd, key)
			}
		}
		if n := len(any.FindAllString(code, -1)); n != len(found) {
			t.Errorf("%s: %d sends of a command whose name is not a string literal", name, n-len(found))
		}
	}
}

// scriptSources returns every embedded script by its file name.
func scriptSources() map[string]string {
	return store.Files()
}

// TestReleaseLeavesNothingPastTheRetryWindow: whatever the lease, a
// released lock leaves no key that outlives the clients' retry window
// (10 s), and no key without a TTL but its fencing counter. (Issue 17: the
// release marker lived a whole lease.)
func TestReleaseLeavesNothingPastTheRetryWindow(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	for _, opts := range [][]Option{nil, {WithFencing()}, {WithFairness(), WithFencing()}} {
		rl := NewRedisLock(FromGoRedis(srv.Client(t)), "retry-window", append(opts, WithExpiry(time.Hour))...)
		mustAcquire(t, rl)
		mustAcquire(t, rl)
		mustRelease(t, rl)
		mustRelease(t, rl)
	}
	keys, err := admin.Keys(ctx, "*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	for _, k := range keys {
		ttl := admin.PTTL(ctx, k).Val()
		switch {
		case k == relatedName("retry-window", "fence"):
			if ttl != -1 {
				t.Errorf("the fencing counter expires in %v", ttl)
			}
		case ttl <= 0 || ttl > 10*time.Second:
			t.Errorf("left %q behind, TTL %v", k, ttl)
		}
	}
}

// TestScriptsTouchOnlyTheirKeys runs every script, down its busy, handed-
// over, given-up, renewed and broken paths, against a real redis-server
// under MONITOR, which shows each command a script runs right after the
// call that ran it; each of those commands must name a key among that
// call's KEYS. (TestScriptsDeclareEveryKey reads the scripts; this watches
// them run.)
func TestScriptsTouchOnlyTheirKeys(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	conn, err := net.Dial("tcp", srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", ok, err)
	}
	lines := make(chan string, 1<<16)
	go func() {
		defer close(lines)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			lines <- strings.TrimRight(l, "\r\n")
		}
	}()

	ctx := context.Background()
	c := srv.Client(t)
	short := WithExpiry(300 * time.Millisecond)
	// Plain and fenced: taken, busy, re-entered, renewed, TTL, released,
	// a given-up attempt, and a release retried.
	a := NewRedisLock(FromGoRedis(c), "mon:plain", WithFencing(), short)
	mustAcquire(t, a)
	if ok, err := NewRedisLock(FromGoRedis(c), "mon:plain").Acquire(); ok || err != nil {
		t.Fatalf("busy: %v, %v", ok, err)
	}
	mustAcquire(t, a)
	if _, err := a.TTL(ctx); err != nil {
		t.Fatal(err)
	}
	until := a.Until()
	waitFor(t, 10*time.Second, "a renewal", func() bool { return a.Until().After(until) })
	mustRelease(t, a)
	id := holderID(a)
	mustRelease(t, a)
	if _, err := a.release(ctx, id, 0); err != nil { // a client's retry
		t.Fatal(err)
	}
	a.letGo(ctx, "given-up", time.Second, time.Minute, true)
	// A semaphore: taken, full, renewed, TTL, inspected, released; a
	// shared lock under an exclusive wait, and broken.
	p := NewRedisLock(FromGoRedis(c), "mon:sem", WithPermits(1), short)
	mustAcquire(t, p)
	if ok, err := NewRedisLock(FromGoRedis(c), "mon:sem", WithPermits(1)).Acquire(); ok || err != nil {
		t.Fatalf("full: %v, %v", ok, err)
	}
	until = p.Until()
	waitFor(t, 10*time.Second, "a renewal", func() bool { return p.Until().After(until) })
	if _, err := p.TTL(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Inspect(ctx); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, p)
	// A fair semaphore: a waiter queued, and handed the permit.
	fp := func() *RedisLock {
		return NewRedisLock(FromGoRedis(srv.Client(t)), "mon:fairsem", WithPermits(1), WithFairness(), short)
	}
	fh, fw := fp(), fp()
	mustAcquire(t, fh)
	fgot := make(chan error, 1)
	go func() { fgot <- fw.AcquireWait(ctx) }()
	waitQueued(t, admin, "mon:fairsem", 1)
	mustRelease(t, fh)
	if err := <-fgot; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, fw)
	sh := NewRedisLock(FromGoRedis(c), "mon:shared", WithShared(), short)
	mustAcquire(t, sh)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := NewRedisLock(FromGoRedis(c), "mon:shared").AcquireWait(wctx); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("an exclusive wait under a share: %v", err)
	}
	cancel()
	if _, err := sh.Break(ctx, sh.Owner()); err != nil {
		t.Fatal(err)
	}
	sh.Release() // broken: it reports the loss
	// Fair and fenced: a waiter refreshed and handed the lock, one that
	// gives up, Inspect, and a Break that hands the lock on.
	fair := func() *RedisLock {
		return NewRedisLock(FromGoRedis(srv.Client(t)), "mon:fair", WithFairness(), WithFencing(), short)
	}
	holder, waiter := fair(), fair()
	mustAcquire(t, holder)
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(ctx) }()
	waitQueued(t, admin, "mon:fair", 1)
	queued := admin.HVals(ctx, relatedName("mon:fair", "waiters")).Val()
	waitFor(t, 10*time.Second, "a refresh of the waiter", func() bool {
		now := admin.HVals(ctx, relatedName("mon:fair", "waiters")).Val()
		return len(now) == 1 && len(queued) == 1 && now[0] != queued[0]
	})
	quitter, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	if err := fair().AcquireWait(quitter); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("the waiter that gives up: %v", err)
	}
	cancel()
	if _, err := holder.Inspect(ctx); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, holder)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	go func() { got <- holder.AcquireWait(ctx) }()
	waitQueued(t, admin, "mon:fair", 1)
	if _, err := waiter.Break(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	mustRelease(t, holder)
	waiter.Release() // its hold was broken: it reports the loss
	// An election: a leader's value proclaimed, read.
	e := NewElection(FromGoRedis(c), "mon:election", short)
	if err := e.Campaign(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := e.Leader(ctx); v != "v" || err != nil {
		t.Fatalf("Leader: %q, %v", v, err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	waitGiveBacks(a)
	time.Sleep(50 * time.Millisecond) // MONITOR's last lines
	conn.Close()

	quoted := regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
	ran := map[string]bool{}
	var keys map[string]bool
	var script string
	checked := 0
	for l := range lines {
		var args []string
		for _, m := range quoted.FindAllStringSubmatch(l, -1) {
			args = append(args, m[1])
		}
		if len(args) == 0 {
			continue
		}
		cmd := strings.ToUpper(args[0])
		if !strings.Contains(l, " lua] ") {
			keys, script = nil, ""
			if strings.HasPrefix(cmd, "EVAL") && len(args) >= 3 { // EVAL, EVALSHA, and their _RO

				n, _ := strconv.Atoi(args[2])
				keys, script = map[string]bool{}, args[1]
				for _, k := range args[3 : 3+n] {
					keys[k] = true
				}
				ran[script] = true
			}
			continue
		}
		if keys == nil {
			t.Errorf("a script's command with no call before it: %s", l)
			continue
		}
		checked++
		if cmd != "TIME" && cmd != "PUBLISH" && (len(args) < 2 || !keys[args[1]]) {
			t.Errorf("a script touched a key not in its KEYS: %s", l)
		}
	}
	for s, src := range sources {
		if !ran[s.Hash()] && !ran[strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(src)] {
			t.Errorf("a script never ran: %.40q", src)
		}
	}
	if checked < 50 {
		t.Fatalf("only %d commands run by scripts seen", checked)
	}
	t.Logf("%d commands run by %d scripts, each within its call's KEYS", checked, len(sources))
}

// TestFastPathsDoAsTheScripts: acquire_fast.lua and release_fast.lua, the
// common cases done before a script makes its functions, leave Redis as
// the scripts without them do, and reply the same, from every state they
// may meet: each state is made twice, on two keys, and the call runs with
// and without its fast path.
func TestFastPathsDoAsTheScripts(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	const id, other = "the-callers-id-0123456789", "another-owner-0123456789"
	type keys struct{ k, abandoned, holders, releases string }
	keysOf := func(k string) keys {
		return keys{k, relatedName(k, "abandoned"), relatedName(k, "holders"), relatedName(k, "releases")}
	}
	sem := func(kind string, n int, holder string) func(keys) {
		return func(ks keys) {
			must(t, c.Set(ctx, ks.k, kind, 10*time.Second).Err())
			must(t, c.ZAdd(ctx, ks.holders, redis.Z{Score: float64(-n), Member: kind},
				redis.Z{Score: float64(time.Now().Add(10 * time.Second).UnixMilli()), Member: holder}).Err())
			must(t, c.PExpire(ctx, ks.holders, 10*time.Second).Err())
		}
	}
	states := map[string]func(keys){
		"free":                 func(keys) {},
		"held by another":      func(ks keys) { must(t, c.Set(ctx, ks.k, other, 10*time.Second).Err()) },
		"held without expiry":  func(ks keys) { must(t, c.Set(ctx, ks.k, other, 0).Err()) },
		"held by this id":      func(ks keys) { must(t, c.Set(ctx, ks.k, id, 10*time.Second).Err()) },
		"given up":             func(ks keys) { must(t, c.SAdd(ctx, ks.abandoned, id).Err()) },
		"given up, another":    func(ks keys) { must(t, c.SAdd(ctx, ks.abandoned, other).Err()) },
		"abandoned not a set":  func(ks keys) { must(t, c.Set(ctx, ks.abandoned, "x", 0).Err()) },
		"not a string":         func(ks keys) { must(t, c.RPush(ctx, ks.k, "x").Err()) },
		"an outsider's prefix": func(ks keys) { must(t, c.Set(ctx, ks.k, "redislock:mine", 10*time.Second).Err()) },
		"semaphore":            sem("redislock:permits", 2, other),
		"semaphore, ours":      sem("redislock:permits", 2, id),
		"shared":               sem("redislock:shared", 0, other),
		"released by this id": func(ks keys) {
			at := (int(id[0]) + 7*int(id[1])) % 64 * len(id)
			must(t, c.SetRange(ctx, ks.releases, int64(at), id).Err())
			must(t, c.PExpire(ctx, ks.releases, 10*time.Second).Err())
		},
		"releases not a string": func(ks keys) { must(t, c.RPush(ctx, ks.releases, "x").Err()) },
		"semaphore, full": func(ks keys) {
			sem("redislock:permits", 2, other)(ks)
			must(t, c.ZAdd(ctx, ks.holders, redis.Z{Score: float64(time.Now().Add(10 * time.Second).UnixMilli()), Member: "third"}).Err())
		},
		"semaphore, a lease ended": func(ks keys) {
			sem("redislock:permits", 2, other)(ks)
			must(t, c.ZAdd(ctx, ks.holders, redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: "third"}).Err())
		},
		"semaphore of 3":   sem("redislock:permits", 3, other),
		"semaphore, alone": sem("redislock:permits", 2, id),
		"shared, a writer waits": func(ks keys) {
			sem("redislock:shared", 0, other)(ks)
			must(t, c.ZAdd(ctx, ks.holders, redis.Z{Score: -float64(time.Now().Add(10 * time.Second).UnixMilli()), Member: "redislock:shared"}).Err())
		},
		"shared, ours too": func(ks keys) {
			sem("redislock:shared", 0, other)(ks)
			must(t, c.ZAdd(ctx, ks.holders, redis.Z{Score: float64(time.Now().Add(10 * time.Second).UnixMilli()), Member: id}).Err())
		},
		"holders not a zset": func(ks keys) {
			must(t, c.Set(ctx, ks.k, "redislock:permits", 10*time.Second).Err())
			must(t, c.Set(ctx, ks.holders, "x", 10*time.Second).Err())
		},
		"semaphore without expiry": func(ks keys) {
			sem("redislock:permits", 2, other)(ks)
			must(t, c.Persist(ctx, ks.k).Err())
			must(t, c.Persist(ctx, ks.holders).Err())
		},
	}
	// dump describes what a call left: each key's type and value, a
	// sorted set's members by whether their score is a lease's end, and
	// whether each key expires.
	dump := func(ks keys) string {
		var b strings.Builder
		for _, k := range []string{ks.k, ks.abandoned, ks.holders, ks.releases} {
			typ := c.Type(ctx, k).Val()
			fmt.Fprintf(&b, "%s:%s", k[strings.Index(k, "|")+1:], typ)
			switch typ {
			case "string":
				fmt.Fprintf(&b, "=%q", strings.TrimRight(c.Get(ctx, k).Val(), "\x00"))
			case "set":
				fmt.Fprint(&b, c.SMembers(ctx, k).Val())
			case "zset":
				for _, z := range c.ZRangeWithScores(ctx, k, 0, -1).Val() {
					fmt.Fprintf(&b, " %v@%v", z.Member, z.Score > 1e12)
				}
			case "list":
				fmt.Fprint(&b, c.LRange(ctx, k, 0, -1).Val())
			}
			fmt.Fprintf(&b, " expires:%v; ", c.PTTL(ctx, k).Val() > 0)
		}
		return b.String()
	}
	calls := []struct {
		name   string
		script *store.Script
		fast   string
		keys   func(keys) []string
		args   []any
	}{
		{"acquire", store.Acquire, "acquire_fast.lua", func(ks keys) []string { return []string{ks.k, ks.abandoned, ks.holders} }, []any{id, 5000}},
		{"release", store.Release, "release_fast.lua", func(ks keys) []string { return []string{ks.k, ks.releases, ks.holders} }, []any{id, "channel"}},
		{"permit", store.PermitAcquire, "permit_acquire_fast.lua", func(ks keys) []string { return []string{ks.k, ks.abandoned, ks.holders} }, []any{id, 5000, 2}},
		{"share", store.PermitAcquire, "permit_acquire_fast.lua", func(ks keys) []string { return []string{ks.k, ks.abandoned, ks.holders} }, []any{id, 5000, 0}},
	}
	for _, call := range calls {
		fast := scriptSources()[call.fast]
		full := call.script.Source()
		if !strings.Contains(full, fast) {
			t.Fatalf("%s does not have %s", call.name, call.fast)
		}
		with := redis.NewScript(full)
		without := redis.NewScript(strings.Replace(full, fast, "local sent, read\n", 1))
		for state, make := range states {
			var replies, dumps [2]string
			for i, script := range []*redis.Script{with, without} {
				ks := keysOf(fmt.Sprintf("fast:%s:%s:%d|k", call.name, state, i))
				make(ks)
				reply, err := script.Run(ctx, c, call.keys(ks), call.args...).Result()
				replies[i] = fmt.Sprintf("%v %v", reply, err)
				replies[i] = strings.ReplaceAll(replies[i], fmt.Sprintf("fast:%s:%s:%d|", call.name, state, i), "")
				if n, ok := reply.(int64); ok && n > 10 { // a PTTL: compare whether it is one
					replies[i] = "a PTTL"
				}
				dumps[i] = dump(ks)
			}
			if replies[0] != replies[1] || dumps[0] != dumps[1] {
				t.Errorf("%s, %s: with its fast path %s, %s\nwithout: %s, %s", call.name, state, replies[0], dumps[0], replies[1], dumps[1])
			}
		}
	}
}
