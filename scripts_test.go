package redislock

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redislock/redislock/internal/redisserver"
)

// TestScriptsDeclareEveryKey: every key a script touches is passed in KEYS
// (Redis requires it; ElastiCache Serverless, Dragonfly and proxies refuse
// or misroute scripts that do not). Each redis.call and redis.pcall names
// its key as KEYS[...] itself, never as a name built from ARGV or a reply;
// the only commands without a key are TIME and PUBLISH (a channel).
func TestScriptsDeclareEveryKey(t *testing.T) {
	call := regexp.MustCompile(`redis\.p?call\(\s*"([A-Za-z]+)"\s*(?:,\s*([^,)]*))?`)
	for name, source := range scriptSources() {
		calls := call.FindAllStringSubmatch(source, -1)
		if len(calls) == 0 {
			t.Errorf("%s: no redis.call found", name)
		}
		for _, c := range calls {
			cmd, key := strings.ToUpper(c[1]), strings.TrimSpace(c[2])
			switch {
			case cmd == "TIME" || cmd == "PUBLISH":
			case !strings.HasPrefix(key, "KEYS["):
				t.Errorf("%s: %s touches %q, which is not one of KEYS", name, cmd, key)
			}
		}
		if strings.Count(source, "redis.call(")+strings.Count(source, "redis.pcall(") != len(calls) {
			t.Errorf("%s: a redis.call whose command is not a string literal", name)
		}
	}
}

// scriptSources returns every embedded script by its file name.
func scriptSources() map[string]string {
	return map[string]string{
		"fence.lua": fenceSource, "acquire.lua": acquireSource, "extend.lua": extendSource,
		"release.lua": releaseSource, "ttl.lua": ttlSource, "inspect.lua": inspectSource, "break.lua": breakSource,
		"fair_acquire.lua": fairAcquireSource, "fair_release.lua": fairReleaseSource, "fair_refresh.lua": fairRefreshSource,
	}
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
