package redislock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Fuzz targets: go test -fuzz FuzzKeysAndOptions (or FuzzFaultyReplies).
// Their seeds run with the normal tests.

// fuzzMini starts a miniredis for a fuzz target and a client of it.
func fuzzMini(f *testing.F) (*miniredis.Miniredis, *redis.Client) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(mr.Close)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	f.Cleanup(func() { _ = c.Close() })
	return mr, c
}

// ourErrors are the errors bad input may give.
var ourErrors = []error{ErrEmptyKey, ErrKeyTooLong, ErrInvalidExpiry, ErrNilStore}

func FuzzKeysAndOptions(f *testing.F) {
	for _, seed := range []struct {
		key                   string
		expiry, maxHold       int64
		setExpire             int
		fencing, useSetExpire bool
	}{
		{"job", int64(time.Second), 0, 0, false, false},
		{"", int64(time.Second), 0, 0, false, false},
		{"{tag}x", int64(time.Second), int64(time.Minute), 0, true, false},
		{"a}b{", -1, -5, -3, true, true},
		{"\x00\xff\n", 0, 0, 1 << 40, false, true},
		{strings.Repeat("k", MaxKeyLen+1), int64(time.Hour), 1, 5, true, true},
		{"other", int64(time.Second), 0, 0, false, false}, // the foreign lock's key
	} {
		f.Add(seed.key, seed.expiry, seed.maxHold, seed.setExpire, seed.fencing, seed.useSetExpire)
	}
	mr, c := fuzzMini(f)

	f.Fuzz(func(t *testing.T, key string, expiry, maxHold int64, setExpire int, fencing, useSetExpire bool) {
		mr.FlushAll()
		if err := mr.Set("other", "someone-else"); err != nil {
			t.Fatal(err)
		}
		opts := []Option{WithExpiry(time.Duration(expiry))}
		if maxHold != 0 {
			opts = append(opts, WithMaxHold(time.Duration(maxHold)))
		}
		if fencing {
			opts = append(opts, WithFencing())
		}
		rl := NewRedisLock(FromGoRedis(c), key, opts...)
		if useSetExpire {
			rl.SetExpire(setExpire)
		}
		ok, err := rl.Acquire()
		switch {
		case err != nil:
			if !isOneOf(err, ourErrors) {
				t.Fatalf("Acquire(%q): unexpected error %v", key, err)
			}
		case ok:
			if v, _ := mr.Get(key); v != holderID(rl) {
				t.Fatalf("key %q holds %q, not our id", key, v)
			}
			ok, err := rl.Release()
			switch {
			case ok && err == nil:
				if mr.Exists(key) {
					t.Fatalf("key %q kept after release", key)
				}
			case errors.Is(err, ErrLockLost), errors.Is(err, ErrMaxHoldExceeded):
				// A lease or maximum hold of a few milliseconds ended the
				// hold before Release: so it must.
			default:
				t.Fatalf("Release(%q) = %v, %v", key, ok, err)
			}
		default:
			if key != "other" {
				t.Fatalf("Acquire(%q) refused on a free key", key)
			}
			if ok, err := rl.Release(); ok || err != nil {
				t.Fatalf("Release of nothing = %v, %v", ok, err)
			}
		}
		if v, _ := mr.Get("other"); v != "someone-else" {
			t.Fatalf("another owner's lock became %q", v)
		}
	})
}

// corrupting is a Scripter that runs scripts on next, or instead of it (or
// after it) answers with garbage, as plan says call by call.
type corrupting struct {
	next Scripter
	plan []byte
	n    int
	s    string
	i    int
}

func (c *corrupting) ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	step := byte(0)
	if len(c.plan) > 0 {
		step = c.plan[c.i%len(c.plan)]
	}
	c.i++
	if step&0x80 != 0 { // run it for real first, then lie about the reply
		if _, err := c.next.ScriptRunCtx(ctx, script, keys, args...); err != nil {
			return nil, err
		}
	}
	switch step & 0x0f {
	case 1:
		return nil, nil
	case 2:
		return nil, redis.Nil
	case 3:
		return int64(c.n), nil
	case 4:
		return c.s, nil
	case 5:
		return []any{c.s, int64(c.n)}, nil
	case 6:
		return []any{"OK", int64(c.n)}, nil
	case 7:
		return nil, errors.New(c.s)
	case 8:
		return 3.14, nil
	case 9:
		return []any{}, nil
	}
	return c.next.ScriptRunCtx(ctx, script, keys, args...) // with 0x80: run twice, as a retry would
}

func FuzzFaultyReplies(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0}, int64(1), "OK", false, false)
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, int64(-2), "garbage", true, true)
	f.Add([]byte{0x84, 0x83, 0x81}, int64(0), "OK", true, false)
	f.Add([]byte{6, 3, 0x86}, int64(7), "NOSCRIPT", false, true)
	f.Add([]byte{0, 3, 3, 3}, int64(-1), "", true, true)
	mr, c := fuzzMini(f)

	f.Fuzz(func(t *testing.T, plan []byte, n int64, s string, fencing, foreignHolds bool) {
		mr.FlushAll()
		if foreignHolds {
			_ = mr.Set("k", "someone-else")
		}
		var opts []Option
		if fencing {
			opts = append(opts, WithFencing())
		}
		store := &corrupting{next: FromGoRedis(c), plan: plan, n: int(n), s: s}
		// A short lease: a give-back whose replies the plan corrupts is tried
		// again until the lease ends.
		rl := NewRedisLock(store, "k", append(opts, WithPubSub(nil), WithExpiry(500*time.Millisecond), WithRetry(LimitRetry(FixedRetry(time.Millisecond), 2)))...)
		ctx := context.Background()
		calls := []func() error{
			func() error { _, err := rl.Acquire(); return err },
			func() error { _, err := rl.Acquire(); return err },
			func() error { _, err := rl.TTL(ctx); return err },
			func() error { _, err := rl.Release(); return err },
			func() error { return rl.AcquireWait(ctx) },
			func() error { _, err := rl.Release(); return err },
			func() error { _, err := rl.Release(); return err },
		}
		for _, call := range calls {
			err := call()
			waitGiveBacks() // one call at a time through the plan
			if errors.Is(err, redis.Nil) {
				t.Fatalf("redis.Nil reached the caller: %v", err)
			}
		}
		for rl.Holds() > 0 || rl.owedReleases() > 0 {
			rl.Release()
		}
		if foreignHolds && mustGet(mr, "k") != "someone-else" {
			t.Fatalf("another owner's lock became %q", mustGet(mr, "k"))
		}
	})
}

// owedReleases returns how many acquisitions still need a Release.
func (rl *RedisLock) owedReleases() int {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil {
		return 0
	}
	return rl.cur.count
}

func isOneOf(err error, targets []error) bool {
	for _, target := range targets {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
