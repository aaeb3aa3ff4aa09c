package redislock

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redislock/redislock/internal/renew"

	"github.com/redislock/redislock/internal/keyslot"
)

func TestFencingTokensIncreaseAcrossHolders(t *testing.T) {
	mr, c := newMini(t)
	a := NewRedisLock(FromGoRedis(c), "job", WithFencing())
	b := NewRedisLock(FromGoRedis(c), "job", WithFencing())
	plain := NewRedisLock(FromGoRedis(c), "job")
	var last int64
	for round := 0; round < 3; round++ {
		for _, rl := range []*RedisLock{a, b} {
			if rl.Token() != 0 {
				t.Fatal("a token before acquiring")
			}
			mustAcquire(t, rl)
			tok := rl.Token()
			if tok <= last {
				t.Fatalf("token %d after %d: not increasing", tok, last)
			}
			last = tok
			mustAcquire(t, rl) // re-entry keeps it
			if rl.Token() != tok {
				t.Fatalf("re-entry changed the token %d to %d", tok, rl.Token())
			}
			if ok, _ := plain.Acquire(); ok {
				t.Fatal("an unfenced lock got a fenced one's key")
			}
			mustRelease(t, rl)
			mustRelease(t, rl)
		}
	}
	if v, _ := mr.Get("{job}:redislock:fence"); v != strconv.FormatInt(last, 10) {
		t.Fatalf("counter = %q, want the last token %d", v, last)
	}
	// Tokens are at least the server's clock in microseconds, so that they
	// go on increasing after a failover that lost the last increments.
	if min := time.Now().Add(-time.Hour).UnixMicro(); last < min {
		t.Fatalf("token %d is below the server's clock in microseconds", last)
	}
	if ttl := mr.TTL("{job}:redislock:fence"); ttl != 0 {
		t.Fatalf("the counter has a TTL %v: it would restart the sequence", ttl)
	}
	mustAcquire(t, plain)
	if plain.Token() != 0 {
		t.Fatal("an unfenced lock has a token")
	}
	mustRelease(t, plain)
}

func TestFencingKeepsTokenThroughRenewalsAndLosers(t *testing.T) {
	w := newWatched(t, "k", WithFencing())
	mr, clk, rl := w.mr, w.clk, w.rl
	tok := rl.Token()
	loser := NewRedisLock(FromGoRedis(newClient(t, mr.Addr())), "k", WithFencing())
	for i := 0; i < 3; i++ {
		clk.Step(t)
		if ok, _ := loser.Acquire(); ok {
			t.Fatal("the loser got it")
		}
	}
	if rl.Token() != tok {
		t.Fatalf("renewals changed the token %d to %d", tok, rl.Token())
	}
	if v, _ := mr.Get("{k}:redislock:fence"); v != strconv.FormatInt(tok, 10) {
		t.Fatalf("losing attempts moved the counter from %d to %q", tok, v)
	}
	mustRelease(t, rl)
}

func TestRelatedNames(t *testing.T) {
	for key, want := range map[string]string{
		"plain":      "{plain}:redislock:x",
		"{tag}rest":  "{tag}rest#redislock:x",
		"a{tag}b{c}": "a{tag}b{c}#redislock:x",
		"a{unclosed": "{a{unclosed}:redislock:x",
		"\x00\xff":   "{\x00\xff}:redislock:x",
	} {
		got := relatedName(key, "x")
		if got != want {
			t.Errorf("relatedName(%q) = %q, want %q", key, got, want)
		}
		if keyslot.Of(got) != keyslot.Of(key) {
			t.Errorf("%q is in slot %d, %q in %d", got, keyslot.Of(got), key, keyslot.Of(key))
		}
	}
	// A '}' without a hash tag: a tag of the key's slot (black-box round
	// 9: "a}b" failed with CROSSSLOT on a cluster).
	for _, key := range []string{"a}b", "{}empty-tag", "x}{", "}", "}{"} {
		for _, kind := range []string{"fence", "waiter:", "broken"} {
			if got := relatedName(key, kind); keyslot.Of(got) != keyslot.Of(key) {
				t.Errorf("%q is in slot %d, %q in %d", got, keyslot.Of(got), key, keyslot.Of(key))
			}
		}
	}
}

// Bug 5 of issue 8: "k" and "{k}" (and "a}b" and "{a}b}") shared one
// wake-up channel and one fencing counter.
func TestRelatedNamesNeverCollide(t *testing.T) {
	keys := []string{"k", "{k}", "a}b", "{a}b}", "{k}#redislock:fence", "{k}:redislock:fence",
		"{{k}}", "{}", "}", "{", "a{}b", "{a{}b}", "x{y}", "{x{y}}",
		"{0}~a}b", "{0}~a}b~redislock:fence", relatedName("a}b", "fence"), "a}b~redislock:fence", "}~redislock:fence"}
	seen := map[string]string{}
	for _, key := range keys {
		for _, kind := range []string{"fence", "released", "releases"} {
			name := relatedName(key, kind)
			if other, dup := seen[name]; dup {
				t.Errorf("%q of %q is also %s", name, key, other)
			}
			seen[name] = fmt.Sprintf("%s of %q", kind, key)
		}
	}
}

func TestClusterSlotMatchesRedis(t *testing.T) {
	// Values from CLUSTER KEYSLOT on Redis 7.0.
	for key, want := range map[string]uint16{"foo": 12182, "bar": 5061, "{user1000}.following": 3443, "": 0} {
		if got := keyslot.Of(key); got != want {
			t.Errorf("keyslot.Of(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestUntilFollowsRenewals(t *testing.T) {
	w := newWatched(t, "k")
	clk, rl := w.clk, w.rl
	lease := 3 * time.Second
	start := clk.Now()
	if got, want := rl.Until(), start.Add(lease-renew.Margin(lease)); !got.Equal(want) {
		t.Fatalf("Until = %v, want %v", got, want)
	}
	clk.Step(t) // the renewal at 1s
	if got, want := rl.Until(), start.Add(time.Second+lease-renew.Margin(lease)); !got.Equal(want) {
		t.Fatalf("after a renewal Until = %v, want %v", got, want)
	}
	mustRelease(t, rl)
	if !rl.Until().IsZero() {
		t.Fatal("Until after release is not zero")
	}
}

func TestFencingTokenAfterLostIncrements(t *testing.T) {
	// A failover can promote a replica that missed the last increments: the
	// counter goes back, and the server's clock keeps the tokens rising.
	mr, c := newMini(t)
	rl := NewRedisLock(FromGoRedis(c), "k", WithFencing())
	mustAcquire(t, rl)
	stale := rl.Token()
	mustRelease(t, rl)
	_ = mr.Set("{k}:redislock:fence", strconv.FormatInt(stale-5, 10)) // as on the promoted replica
	time.Sleep(time.Millisecond)
	mustAcquire(t, rl)
	if rl.Token() <= stale {
		t.Fatalf("token %d after the counter went back, not above %d", rl.Token(), stale)
	}
	mustRelease(t, rl)
	_ = mr.Set("{k}:redislock:fence", strconv.FormatInt(time.Now().Add(time.Hour).UnixMicro(), 10)) // a clock ahead
	before, _ := mr.Get("{k}:redislock:fence")
	mustAcquire(t, rl)
	if want, _ := strconv.ParseInt(before, 10, 64); rl.Token() != want+1 {
		t.Fatalf("token %d, want the counter plus one %d", rl.Token(), want+1)
	}
	mustRelease(t, rl)
}

func TestFencedAcquireGarbage(t *testing.T) {
	for _, reply := range []any{"OK", []any{"OK"}, []any{"OK", "1"}, []any{"OK", int64(0)}, []any{"NO", int64(3)}} {
		rl := NewRedisLock(replyStore{reply: reply}, "k", WithFencing())
		if ok, err := rl.AcquireCtx(context.Background()); ok || err == nil {
			t.Errorf("fenced acquire with reply %#v = %v, %v; want an error", reply, ok, err)
		}
	}
}
