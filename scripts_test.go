package redislock

import (
	"bufio"
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redislock/redislock/internal/store"

	"github.com/redislock/redislock/internal/redisserver"
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
