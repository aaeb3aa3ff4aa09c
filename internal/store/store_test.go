package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// These tests need no lock: the scripts run on miniredis, the parsers on
// replies made by hand.

func TestRunFallsBackToEVALAndReadOnly(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	st := New(GoRedis(c))
	ctx := context.Background()
	if !st.Single || st.Sub == nil || !st.Pipelined() {
		t.Fatalf("a go-redis Client: single %v, pub/sub %v, pipelines %v", st.Single, st.Sub != nil, st.Pipelined())
	}
	// Never loaded: EVALSHA gets NOSCRIPT, then EVAL runs it.
	reply, err := st.Run(ctx, Acquire, []string{"k", "{k}:redislock:abandoned"}, "me", 1000)
	if reply != "OK" || err != nil {
		t.Fatalf("acquire = %v, %v", reply, err)
	}
	// miniredis refuses TIME in a read-only script: Inspect goes on
	// with EVALSHA, and so do later read-only scripts.
	in, err := st.Run(ctx, Inspect, []string{"k", "f", "q", "w"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseInspect(in); err != nil || got.Owner != "me" || got.Kind != "string" {
		t.Fatalf("inspection %+v, %v", got, err)
	}
	if st.readOnly.Load() != nil {
		t.Error("read-only scripts still tried on a server that refuses them")
	}
	if left, ours, err := ParseTTL(must(st.Run(ctx, TTL, []string{"k"}, "me"))); !ours || err != nil || left <= 0 {
		t.Errorf("TTL = %v, %v, %v", left, ours, err)
	}
}

func must(reply any, err error) any {
	if err != nil {
		panic(err)
	}
	return reply
}

func TestRunAllPipelinesAndSplits(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	st := New(GoRedis(c))
	ctx := context.Background()
	mr.Set("a", "x")
	mr.Set("b", "y")
	calls := []*Call{
		{Ctx: ctx, Script: Extend, Keys: []string{"a", "b"}, Args: []any{"x", 1000, "other", 1000}},
		{Ctx: ctx, Script: Extend, Keys: []string{"c"}, Args: []any{"x", 1000}},
	}
	groups := 0
	st.RunAll(ctx, calls, func(done []*Call) { groups++ })
	if groups != 1 {
		t.Errorf("%d groups for one server", groups)
	}
	if codes, err := RenewalCodes(calls[0], 2); err != nil || codes[0] != 1 || codes[1] != 0 {
		t.Errorf("codes %v, %v; want [1 0]", codes, err)
	}
	if codes, err := RenewalCodes(calls[1], 1); err != nil || codes[0] != 0 {
		t.Errorf("codes %v, %v; want [0]", codes, err)
	}
	if mr.TTL("a") == 0 || mr.TTL("b") != 0 {
		t.Error("renewed the wrong key")
	}
}

func TestRefusalNamesTheCommand(t *testing.T) {
	for _, tc := range []struct {
		reply          string
		command, key   string
		text, startsAs string
	}{
		{"READONLY You can't write against a read only replica. [redislock: SET nightly]", "SET", "nightly", "READONLY You can't write", "READONLY"},
		{"ERR The user executing the script can't run this command or subcommand [redislock: TIME]", "TIME", "", "ERR The user", "ERR"},
		{"NOPERM this user has no permissions to run the 'evalsha' command", "EVALSHA", "k", "NOPERM", "NOPERM"},
	} {
		_, err := checkReply(nil, proto(tc.reply), "EVALSHA", "k")
		var r *Refusal
		var e redis.Error
		switch {
		case !errors.Is(err, ErrRefused) || !errors.As(err, &r) || !errors.As(err, &e):
			t.Errorf("%q: %v is no refusal", tc.reply, err)
		case r.Command != tc.command || r.Key != tc.key:
			t.Errorf("%q: names %q %q", tc.reply, r.Command, r.Key)
		case !strings.HasPrefix(e.Error(), tc.startsAs) || strings.Contains(e.Error(), refusalMark):
			t.Errorf("%q: the server's error reads %q", tc.reply, e.Error())
		}
	}
	if _, err := checkReply(nil, proto("REDISLOCK_CORRUPT_COUNTER {k}:redislock:fence"), "EVALSHA", "k"); !errors.Is(err, ErrCorruptFencingCounter) || errors.Is(err, ErrRefused) {
		t.Errorf("a corrupt counter: %v", err)
	}
	// The same mistakes as call.lua replies them: statuses, for no breaker to count.
	if _, err := checkReply("REDISLOCK_CORRUPT_COUNTER {k}:redislock:fence", nil, "EVALSHA", "k"); !errors.Is(err, ErrCorruptFencingCounter) || errors.Is(err, ErrRefused) {
		t.Errorf("a corrupt counter's status: %v", err)
	}
	if _, err := checkReply("REDISLOCK_KIND k is a semaphore", nil, "EVALSHA", "k"); !errors.Is(err, ErrWrongKind) || errors.Is(err, ErrRefused) ||
		!strings.HasSuffix(err.Error(), "k is a semaphore") {
		t.Errorf("a wrong kind's status: %v", err)
	}
	if reply, err := checkReply("OK", nil, "EVALSHA", "k"); reply != "OK" || err != nil {
		t.Errorf("OK: %v, %v", reply, err)
	}
	if _, err := checkReply(nil, redis.Nil, "EVALSHA", "k"); !errors.Is(err, ErrUnexpectedReply) {
		t.Errorf("redis.Nil: %v", err)
	}
	if Ambiguous(refused(proto("OOM x"), "EVALSHA", "k")) || !Ambiguous(context.DeadlineExceeded) {
		t.Error("a refusal is ambiguous, or a timeout is not")
	}
}

// proto is an error reply as go-redis gives it.
type proto string

func (p proto) Error() string { return string(p) }
func (p proto) RedisError()   {}

func TestReplies(t *testing.T) {
	if tok, pttl, err := ParseAcquire(int64(1500), false); tok != -1 || pttl != 1500*time.Millisecond || err != nil {
		t.Errorf("busy: %v %v %v", tok, pttl, err)
	}
	if _, _, err := ParseAcquire("OK", true); !errors.Is(err, ErrUnexpectedReply) {
		t.Error("OK for a fenced lock passed")
	}
	if tok, _, err := ParseAcquire([]any{"OK", int64(7)}, true); tok != 7 || err != nil {
		t.Errorf("fenced: %v %v", tok, err)
	}
	if _, wait, seq, err := ParseFairAcquire([]any{int64(20), int64(5)}, false); wait != 20*time.Millisecond || seq != 5 || err != nil {
		t.Errorf("queued: %v %v %v", wait, seq, err)
	}
	for reply, want := range map[any]int64{int64(0): 0, int64(1): 1, int64(2): 2, int64(3): 3, "w 5 0 100": 1, "!w 5 0 100": 3,
		"w 5 0 100\nv 6 0 100": 1, "!w 5 0 100\nv 6 0 100": 3} { // shares handed to two waiters
		if code, err := ReleaseCode(&Call{Script: FairRelease, Reply: reply}); code != want || err != nil {
			t.Errorf("release reply %v: %d, %v; want %d", reply, code, err, want)
		}
	}
	if _, err := ReleaseCode(&Call{Script: Release, Reply: "w 5 0 100"}); !errors.Is(err, ErrUnexpectedReply) {
		t.Error("a handoff message from release.lua passed")
	}
	if id, m, ok := ParseHandoff("w 5 9 100"); !ok || id != "w" || m.Seq != 5 || m.Token != 9 || m.Lease != 100*time.Millisecond {
		t.Errorf("handoff %q %+v %v", id, m, ok)
	}
	if _, _, ok := ParseHandoff(""); ok {
		t.Error("an empty message is a handoff")
	}
	if n, ok := ParseCounter("9007199254740992"); ok {
		t.Errorf("2^53 read as %d", n)
	}
	if code, owner, pttl, err := ParseBreak([]any{int64(3), "o", int64(100)}); code != 3 || owner != "o" || pttl != 100 || err != nil {
		t.Errorf("break %v %v %v %v", code, owner, pttl, err)
	}
}

// A pipeline that go-zero's breaker refuses sends nothing: each call gets
// the breaker's error, not a nil reply (black-box round 19: Close said
// "unexpected reply from redis: nil").
func TestPipelineRefusedWholeGivesItsError(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	st := New(GoRedis(c))
	open := errors.New("circuit breaker is open")
	st.SetPipeline(func(ctx context.Context, fn func(redis.Pipeliner) error) error {
		_ = fn(c.Pipeline()) // queued, never sent
		return open
	})
	calls := []*Call{{Ctx: context.Background(), Script: Release, Keys: []string{"k", "m"}, Args: []any{"id", "ch"}}}
	st.RunAll(context.Background(), calls, func([]*Call) {})
	if !errors.Is(calls[0].Err, open) {
		t.Fatalf("the call's error: %v; want the pipeline's", calls[0].Err)
	}
}

// TestRecordOfReleases: a retried release is told it ran while the record
// keeps its id, through other owners' releases, and is a loss once a later
// id took its slot, as call.lua says. The record expires with the retry window.
func TestRecordOfReleases(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	st := New(GoRedis(c))
	ctx := context.Background()
	keys := []string{"k", "{k}:redislock:releases"}
	release := func(id string) int64 {
		code, err := ReleaseCode(&Call{Reply: must(st.Run(ctx, Release, keys, id, "ch"))})
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	// "AB" and "HA" share a slot (65 + 7*66 = 72 + 7*65 mod 64); "AC" has another.
	for _, step := range []struct {
		id   string
		want int64
	}{{"AB", 1}, {"AC", 1}, {"AB", 2}, {"AC", 2}, {"HA", 1}, {"AC", 2}} {
		if step.want == 1 { // a round: acquired, then released
			if got := must(st.Run(ctx, Acquire, []string{"k", "{k}:redislock:abandoned"}, step.id, 10000)); got != "OK" {
				t.Fatalf("acquire %s = %v", step.id, got)
			}
		}
		if code := release(step.id); code != step.want {
			t.Errorf("release of %s = %d, want %d", step.id, code, step.want)
		}
	}
	if code := release("AB"); code != 0 {
		t.Errorf("a retry of AB after HA took its slot = %d, want 0 (a loss)", code)
	}
	if ttl := mr.TTL(keys[1]); ttl <= 9*time.Second || ttl > 10*time.Second {
		t.Errorf("the record expires in %v, want 10 s", ttl)
	}
}
