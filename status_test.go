package redislock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// TestInspect reads every field of Status from a real server: free, held
// and fenced, without expiry, a fair lock with live and lapsed waiters, and
// keys that someone else wrote.
func TestInspect(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	const key = "inspect"
	rl := NewRedisLock(FromGoRedis(c), key, WithFencing(), WithExpiry(5*time.Second))
	probe := NewRedisLock(FromGoRedis(admin), key)

	st, err := probe.Inspect(ctx)
	if err != nil || st != (Status{Key: key}) {
		t.Fatalf("free: Inspect = %+v, %v; want only the key", st, err)
	}
	mustAcquire(t, rl)
	mustAcquire(t, rl) // a re-entry changes nothing that Redis shows
	st, err = probe.Inspect(ctx)
	switch {
	case err != nil:
		t.Fatal(err)
	case !st.Held || st.Owner == "" || st.Owner != rl.Owner():
		t.Fatalf("held: Inspect = %+v; want owner %q", st, rl.Owner())
	case st.TTL <= 0 || st.TTL > 5*time.Second:
		t.Fatalf("held: TTL %v; want in (0, 5s]", st.TTL)
	case st.Fence == 0 || st.Fence != rl.Token():
		t.Fatalf("held: Fence %d; want the holder's token %d", st.Fence, rl.Token())
	case st.Waiters != 0:
		t.Fatalf("held: %d waiters; want 0", st.Waiters)
	}
	if now := admin.Time(ctx).Val(); st.Expires.Sub(now) <= 0 || st.Expires.Sub(now) > 5*time.Second {
		t.Fatalf("held: expires at %v, server time %v; want within the lease", st.Expires, now)
	}
	if probe.Holds() != 0 || probe.Owner() != "" {
		t.Fatal("Inspect gave the probing lock a hold")
	}
	admin.Persist(ctx, key)
	if st, err = probe.Inspect(ctx); err != nil || st.TTL != -1 || !st.Expires.IsZero() {
		t.Fatalf("no expiry: Inspect = %+v, %v; want TTL -1, no Expires", st, err)
	}
	mustRelease(t, rl)
	mustRelease(t, rl)

	// A fair lock: two live waiters and one that lapsed.
	fair := NewRedisLock(FromGoRedis(c), "fair-inspect", WithFairness(), WithExpiry(time.Second))
	mustAcquire(t, fair)
	var wg sync.WaitGroup
	waitCtx, stop := context.WithCancel(ctx)
	for range 2 {
		w := NewRedisLock(FromGoRedis(srv.Client(t)), "fair-inspect", WithFairness(), WithExpiry(time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.AcquireWait(waitCtx); err == nil {
				w.Release()
			}
		}()
	}
	waitQueued(t, admin, "fair-inspect", 2)
	admin.ZAdd(ctx, relatedName("fair-inspect", "queue"), redis.Z{Score: 1, Member: "lapsed"}) // no liveness key
	st, err = NewRedisLock(FromGoRedis(admin), "fair-inspect").Inspect(ctx)
	if err != nil || st.Waiters != 2 || st.Owner != fair.Owner() {
		t.Fatalf("fair: Inspect = %+v, %v; want 2 live waiters, owner %q", st, err, fair.Owner())
	}
	stop()
	wg.Wait()
	mustRelease(t, fair)

	// Keys that someone else wrote.
	admin.HSet(ctx, "hash", "a", "b")
	if _, err := NewRedisLock(FromGoRedis(admin), "hash").Inspect(ctx); !errors.Is(err, ErrWrongType) {
		t.Fatalf("a hash: Inspect err = %v; want ErrWrongType", err)
	}
	// Counters as acquisitions read them (black-box round 10: "", "-0" and
	// 2^53 passed Inspect, though an acquisition refuses them).
	// 2^53-1, the last token, reads as a token, though acquisitions refuse
	// the counter as used up.
	for counter, ok := range map[string]bool{"x1": false, "": false, "-0": false, "9007199254740992": false,
		"9007199254740991": true, "9007199254740990": true, "0": true, "12": true} {
		admin.Set(ctx, relatedName("badfence", "fence"), counter, 0)
		st, err := NewRedisLock(FromGoRedis(admin), "badfence").Inspect(ctx)
		fenced := NewRedisLock(FromGoRedis(admin), "badfence", WithFencing())
		_, acqErr := fenced.AcquireCtx(ctx)
		usedUp := counter == "9007199254740991"
		if ok != (err == nil) || (ok && !usedUp) != (acqErr == nil) || (!ok && !errors.Is(err, ErrCorruptFencingCounter)) {
			t.Errorf("counter %q: Inspect = %+v, %v; acquisition err %v", counter, st, err, acqErr)
		}
		releaseAll(fenced)
	}
	var nilLock *RedisLock
	if _, err := nilLock.Inspect(ctx); !errors.Is(err, ErrNilStore) {
		t.Fatalf("nil lock: err = %v; want ErrNilStore", err)
	}
	//lint:ignore SA1012 a nil context is the point
	if _, err := probe.Inspect(nil); !errors.Is(err, ErrNilContext) { //nolint:staticcheck
		t.Fatalf("nil ctx: err = %v; want ErrNilContext", err)
	}
}

// TestBreak breaks a lock held by an outsider for a minute: its waiter
// wakes at once and takes it. Then it breaks a renewing holder's lock: the
// holder learns of the loss at its next renewal. A break for another
// owner, of a free lock and of a key that is not a lock change nothing.
func TestBreak(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	const key = "break"
	op := NewRedisLock(FromGoRedis(admin), key)
	admin.Set(ctx, key, "outsider", time.Minute)

	st, err := op.Break(ctx, "someone-else")
	if !errors.Is(err, ErrHeldByOther) || st.Owner != "outsider" {
		t.Fatalf("Break(other) = %+v, %v; want ErrHeldByOther naming the holder", st, err)
	}
	if v := admin.Get(ctx, key).Val(); v != "outsider" {
		t.Fatalf("Break(other) changed the key to %q", v)
	}

	waiter := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithExpiry(600*time.Millisecond), WithRetry(FixedRetry(time.Hour)))
	got := make(chan error, 1)
	go func() { got <- waiter.AcquireWait(ctx) }()
	waitSubscribed(t, admin, relatedName(key, "released"))
	st, err = op.Break(ctx, "")
	if err != nil || !st.Held || st.Owner != "outsider" || st.TTL <= 0 || st.TTL > time.Minute {
		t.Fatalf("Break = %+v, %v; want the outsider's status", st, err)
	}
	// The waiter's next attempt was due when the outsider's minute ran
	// out: it took the lock sooner only because the break woke it.
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter did not wake at the break")
	}

	// The waiter now holds and renews: break it by its id.
	id := waiter.Owner()
	if st, err = op.Break(ctx, id); err != nil || !st.Held || st.Owner != id {
		t.Fatalf("Break(owner) = %+v, %v; want the waiter's status", st, err)
	}
	if n := admin.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("Break(owner) left the key")
	}
	waitDone(t, waiter.Done(), "the broken holder's hold")
	if !errors.Is(waiter.Err(), ErrLockLost) {
		t.Fatalf("broken holder: Err = %v; want ErrLockLost", waiter.Err())
	}
	if ok, err := waiter.Release(); ok || !errors.Is(err, ErrLockLost) {
		t.Fatalf("broken holder: Release = %v, %v; want false, ErrLockLost", ok, err)
	}
	if st, err = op.Break(ctx, ""); err != nil || st.Held {
		t.Fatalf("Break(free) = %+v, %v; want Held false, nil", st, err)
	}

	admin.HSet(ctx, "hash", "a", "b")
	if _, err := NewRedisLock(FromGoRedis(admin), "hash").Break(ctx, ""); !errors.Is(err, ErrWrongType) {
		t.Fatalf("Break(hash) err = %v; want ErrWrongType", err)
	}
	if admin.Exists(ctx, "hash").Val() != 1 {
		t.Fatal("Break deleted a hash")
	}
}

// TestBreakRetriedAfterLostReply: a client runs the break script again
// after its reply was lost, and meanwhile another owner took the lock. The
// retry reports the break as done and leaves the new holder's lock alone.
func TestBreakRetriedAfterLostReply(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	const key = "break-retry"
	holder := NewRedisLock(FromGoRedis(c), key, WithExpiry(time.Minute))
	mustAcquire(t, holder)
	next := NewRedisLock(FromGoRedis(c), key, WithExpiry(time.Minute))
	retried := false
	store := scripterFunc(func(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
		reply, err := script.Run(ctx, c, keys, args...).Result()
		if script == breakScript && !retried {
			retried = true
			mustAcquire(t, next) // between the run and the client's retry
			reply, err = script.Run(ctx, c, keys, args...).Result()
		}
		return reply, err
	})
	st, err := NewRedisLock(store, key).Break(ctx, "")
	if err != nil || st.Owner != holder.Owner() {
		t.Fatalf("Break = %+v, %v; want done, from the first holder", st, err)
	}
	if v := admin.Get(ctx, key).Val(); v != next.Owner() || v == "" {
		t.Fatalf("key = %q; want the next holder's %q", v, next.Owner())
	}
	mustRelease(t, next)
	if ok, err := holder.Release(); ok || !errors.Is(err, ErrLockLost) { // the broken holder
		t.Fatalf("broken holder: Release = %v, %v; want false, ErrLockLost", ok, err)
	}
}

// waitSubscribed waits until someone subscribes to channel.
func waitSubscribed(t *testing.T, admin *redis.Client, channel string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		n := admin.PubSubNumSub(context.Background(), channel).Val()[channel]
		if n > 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("nobody subscribed to %s", channel)
		}
	}
}

// TestWatchSeesHandoffAndRenewals: Watch reports a fair lock's holder, its
// renewals, the handoff to its waiter (never free in between: the handoff
// is atomic) and the end, in that order.
func TestWatchSeesHandoffAndRenewals(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	const key = "watched"
	lease := 300 * time.Millisecond
	a := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(lease))
	b := NewRedisLock(FromGoRedis(srv.Client(t)), key, WithFairness(), WithExpiry(lease))
	w := NewRedisLock(FromGoRedis(srv.Client(t)), key)

	var mu sync.Mutex
	var seen []Status
	watchCtx, stop := context.WithCancel(ctx)
	watched := make(chan error, 1)
	first := make(chan struct{})
	go func() {
		watched <- w.Watch(watchCtx, time.Hour, func(st Status) { // no polls: releases only, at first
			mu.Lock()
			seen = append(seen, st)
			if len(seen) == 1 {
				close(first)
			}
			mu.Unlock()
		})
	}()
	<-first
	mustAcquire(t, a)
	bIn := make(chan error, 1)
	go func() { bIn <- b.AcquireWait(ctx) }()
	waitQueued(t, srv.Client(t), key, 1)
	time.Sleep(2 * lease) // a's lease is renewed meanwhile; only polls would see that
	mustRelease(t, a)     // hands the lock to b
	if err := <-bIn; err != nil {
		t.Fatal(err)
	}
	idB := b.Owner()
	waitFor(t, 30*time.Second, "Watch to see b", func() bool { mu.Lock(); defer mu.Unlock(); return seen[len(seen)-1].Owner == idB })
	mustRelease(t, b)
	waitFor(t, 30*time.Second, "Watch to see the lock free", func() bool { mu.Lock(); defer mu.Unlock(); return !seen[len(seen)-1].Held })
	stop()
	if err := <-watched; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch = %v; want context.Canceled", err)
	}

	mu.Lock()
	defer mu.Unlock()
	var owners []string
	for _, st := range seen {
		if len(owners) == 0 || owners[len(owners)-1] != st.Owner {
			owners = append(owners, st.Owner)
		}
	}
	// a was never seen: its acquisition published nothing, and the poll is
	// an hour. The handoff's message shows b; b's release shows the end.
	if want := []string{"", idB, ""}; !slices.Equal(owners, want) {
		t.Fatalf("owners seen %q; want %q (no poll: a unseen; b, then free)", owners, want)
	}

	// With polls: renewals show as leases extended.
	seen = nil
	mustAcquire(t, a)
	pollCtx, stopPoll := context.WithCancel(ctx)
	done := make(chan error, 1)
	var extended int
	go func() {
		done <- w.Watch(pollCtx, 20*time.Millisecond, func(st Status) {
			if st.Owner == a.Owner() && len(seen) > 0 && seen[len(seen)-1].Owner == st.Owner {
				extended++
				if extended == 2 {
					stopPoll()
				}
			}
			seen = append(seen, st)
		})
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		stopPoll()
		t.Fatalf("Watch saw %d renewals of a's lease in 30 s; want 2", extended)
	}
	mustRelease(t, a)
}

// TestOperatorCallsRaceEveryCall: Break, Inspect, Watch and Owner race
// every other public call on two lock values of one key, plain and fair,
// with contexts ending at random. Nothing panics or hangs, AcquireWait never
// returns nil without a hold or a reason, Break and Watch return only the
// errors they document, a Status never says held without an owner, and no
// key is left behind but the markers that expire.
func TestOperatorCallsRaceEveryCall(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "fair"}[fair], func(t *testing.T) {
			srv := redisserver.Start(t)
			admin := srv.Client(t)
			ctx := context.Background()
			key := "operator:races"
			opts := []Option{WithExpiry(300 * time.Millisecond)}
			if fair {
				opts = append(opts, WithFairness())
			}
			a := NewRedisLock(FromGoRedis(srv.Client(t)), key, opts...)
			b := NewRedisLock(FromGoRedis(srv.Client(t)), key, opts...)
			op := NewRedisLock(FromGoRedis(admin), key)
			end := time.Now().Add(2 * time.Second)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var problems []string
			problem := func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				if len(problems) < 10 {
					problems = append(problems, fmt.Sprintf(format, args...))
				}
			}
			checkStatus := func(st Status) {
				if st.Held != (st.Owner != "") || (!st.Held && st.TTL != 0) || st.Key != key {
					problem("status %+v", st)
				}
			}
			for g := 0; g < 6; g++ {
				rl := []*RedisLock{a, b}[g%2]
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(end); i++ {
						wctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
						switch (i + g) % 5 {
						case 0, 1:
							if err := rl.AcquireWait(wctx); err == nil {
								if rl.Holds() == 0 && rl.Err() == nil {
									problem("AcquireWait returned nil without the lock")
								}
								_ = rl.Owner()
								_, _ = rl.Release()
							}
						case 2:
							if ok, _ := rl.AcquireCtx(wctx); ok {
								_, _ = rl.TTL(wctx)
								_, _ = rl.ReleaseCtx(wctx)
							}
						case 3:
							if st, err := rl.Inspect(wctx); err == nil {
								checkStatus(st)
							}
							_ = rl.Owner()
						case 4:
							owner := ""
							if rand.IntN(2) == 0 {
								owner = rl.Owner()
							}
							st, err := op.Break(wctx, owner)
							if err != nil && !errors.Is(err, ErrHeldByOther) && !errors.Is(err, context.DeadlineExceeded) {
								problem("Break: %v", err)
							}
							if err == nil {
								checkStatus(st)
							}
						}
						cancel()
					}
				}()
			}
			wctx, stop := context.WithCancel(ctx)
			watched := make(chan error, 1)
			go func() { watched <- op.Watch(wctx, 5*time.Millisecond, checkStatus) }()
			wg.Wait()
			stop()
			if err := <-watched; !errors.Is(err, context.Canceled) {
				t.Errorf("Watch = %v; want context.Canceled", err)
			}
			releaseAll(a, b) // acquisitions of holds that ended meanwhile
			waitGiveBacks()
			for _, p := range problems {
				t.Error(p)
			}
			waitFor(t, 5*time.Second, "the key released", func() bool { return admin.Exists(ctx, key).Val() == 0 })
			waitKeysGone(t, admin, key, 3*time.Second)
		})
	}
}

// TestBreakAgainAfterNewHolder: a second Break of owner X, after X's lock
// was broken and Y took it, breaks nothing and says Y holds the lock
// (black-box round 9: the marker of the first break answered it as done).
func TestBreakAgainAfterNewHolder(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	op := NewRedisLock(FromGoRedis(admin), "again")
	admin.Set(ctx, "again", "X", time.Minute)
	if st, err := op.Break(ctx, "X"); err != nil || st.Owner != "X" {
		t.Fatalf("first Break(X) = %+v, %v", st, err)
	}
	admin.Set(ctx, "again", "Y", time.Minute)
	st, err := op.Break(ctx, "X")
	if !errors.Is(err, ErrHeldByOther) || st.Owner != "Y" || !st.Held {
		t.Fatalf("second Break(X) = %+v, %v; want ErrHeldByOther, held by Y", st, err)
	}
	if admin.Get(ctx, "again").Val() != "Y" {
		t.Fatal("the second Break deleted Y's lock")
	}
}

// TestBreakWithoutOwnerWhileTheLockChangesHands: Break without an owner
// breaks whoever holds the lock when its script runs, even when the lock
// changed hands since Break read it (black-box round 9: after three changes
// it gave up with ErrHeldByOther).
func TestBreakWithoutOwnerWhileTheLockChangesHands(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	n := 0
	store := scripterFunc(func(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
		if script == breakScript {
			n++
			admin.Set(ctx, "busy", fmt.Sprint("holder-", n), time.Minute) // a new holder since Inspect
		}
		return script.Run(ctx, c, keys, args...).Result()
	})
	op := NewRedisLock(store, "busy")
	for i := 1; i <= 5; i++ {
		admin.Set(ctx, "busy", "first", time.Minute)
		st, err := op.Break(ctx, "")
		if err != nil || st.Owner != fmt.Sprint("holder-", i) {
			t.Fatalf("Break = %+v, %v; want holder-%d broken", st, err, i)
		}
		if admin.Exists(ctx, "busy").Val() != 0 {
			t.Fatal("the key is still there")
		}
	}
}

// TestTTLBeyondDuration: a key whose expiry someone set centuries ahead
// reads as the longest Duration, not a negative one (black-box round 9).
func TestTTLBeyondDuration(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	rl := NewRedisLock(FromGoRedis(srv.Client(t)), "forever", WithoutWatchdog(), WithExpiry(time.Minute))
	mustAcquire(t, rl)
	admin.Do(ctx, "PEXPIRE", "forever", int64(10_000_000_000_000)) // 317 years
	if st, err := rl.Inspect(ctx); err != nil || st.TTL != math.MaxInt64 {
		t.Fatalf("Inspect = %+v, %v; want the longest Duration", st, err)
	}
	if d, err := rl.TTL(ctx); err != nil || d != math.MaxInt64 {
		t.Fatalf("TTL = %v, %v; want the longest Duration", d, err)
	}
	mustRelease(t, rl)
}

// TestWatchReportsNoChangeWithoutOne: a lock held without renewal, read
// every 2 ms, is reported once: the server's clock, not the client's,
// tells whether its lease moved.
func TestWatchReportsNoChangeWithoutOne(t *testing.T) {
	srv := redisserver.Start(t)
	rl := NewRedisLock(FromGoRedis(srv.Client(t)), "still", WithoutWatchdog(), WithExpiry(time.Minute))
	mustAcquire(t, rl)
	defer rl.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var seen []Status
	err := NewRedisLock(FromGoRedis(srv.Client(t)), "still").Watch(ctx, 2*time.Millisecond, func(st Status) { seen = append(seen, st) })
	if !errors.Is(err, context.DeadlineExceeded) || len(seen) != 1 || seen[0].Owner != rl.Owner() {
		t.Fatalf("Watch = %v, saw %+v; want one status, the holder's", err, seen)
	}
}

// nilSubscriber gives no PubSub.
type nilSubscriber struct{}

func (nilSubscriber) Subscribe(context.Context, ...string) *redis.PubSub { return nil }

// TestWatchWithoutReleaseChannel: with a Subscriber that gives no PubSub,
// or one whose server is unreachable, Watch polls, and sees a holder come
// and go.
func TestWatchWithoutReleaseChannel(t *testing.T) {
	srv := redisserver.Start(t)
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer dead.Close()
	for name, sub := range map[string]Subscriber{"nil PubSub": nilSubscriber{}, "unreachable": dead} {
		holder := NewRedisLock(FromGoRedis(srv.Client(t)), "polled")
		w := NewRedisLock(FromGoRedis(srv.Client(t)), "polled", WithPubSub(sub))
		ctx, cancel := context.WithCancel(context.Background())
		seen := make(chan Status, 100)
		done := make(chan error, 1)
		go func() { done <- w.Watch(ctx, 10*time.Millisecond, func(st Status) { seen <- st }) }()
		next := func() Status {
			select {
			case st := <-seen:
				return st
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: no status in 30 s", name)
				return Status{}
			}
		}
		if st := next(); st.Held {
			t.Fatalf("%s: first status %+v; want free", name, st)
		}
		mustAcquire(t, holder)
		if st := next(); st.Owner != holder.Owner() {
			t.Fatalf("%s: status %+v; want the holder's", name, st)
		}
		mustRelease(t, holder)
		for next().Held {
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Watch = %v", name, err)
		}
	}
}

// TestBreakWithCorruptCounter: a lock whose fencing counter someone
// overwrote can still be broken (black-box round 11: Break failed with
// ErrCorruptFencingCounter and left the stuck lock).
func TestBreakWithCorruptCounter(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	admin.Set(ctx, "stuck", "crashed", time.Hour)
	admin.Set(ctx, relatedName("stuck", "fence"), "abc", 0)
	st, err := NewRedisLock(FromGoRedis(admin), "stuck").Break(ctx, "")
	if err != nil || st.Owner != "crashed" || st.Fence != 0 {
		t.Fatalf("Break = %+v, %v; want the lock broken", st, err)
	}
	if admin.Exists(ctx, "stuck").Val() != 0 {
		t.Fatal("the key is still there")
	}
}

// TestWatchSeesExpiryMoves: an expiry shortened, removed and set again are
// changes, reported once each; Expires is the server's PEXPIRETIME.
func TestWatchSeesExpiryMoves(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	admin.Set(ctx, "moved", "owner", time.Hour)
	seen := make(chan Status, 10)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- NewRedisLock(FromGoRedis(admin), "moved").Watch(wctx, 5*time.Millisecond, func(st Status) { seen <- st })
	}()
	next := func() Status {
		select {
		case st := <-seen:
			return st
		case <-time.After(30 * time.Second):
			t.Fatal("no status in 30 s")
			return Status{}
		}
	}
	st := next()
	if want := admin.PExpireTime(ctx, "moved").Val(); st.Expires.UnixMilli() != want.Milliseconds() {
		t.Fatalf("Expires %v; PEXPIRETIME %v", st.Expires.UnixMilli(), want.Milliseconds())
	}
	admin.PExpire(ctx, "moved", time.Minute) // shortened
	if st = next(); st.TTL > time.Minute || st.Expires.IsZero() {
		t.Fatalf("after the shortening: %+v", st)
	}
	admin.Persist(ctx, "moved")
	if st = next(); st.TTL != -1 || !st.Expires.IsZero() {
		t.Fatalf("after PERSIST: %+v", st)
	}
	admin.PExpire(ctx, "moved", time.Hour)
	if st = next(); st.TTL <= time.Minute || st.Expires.IsZero() {
		t.Fatalf("after the expiry was set: %+v", st)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if len(seen) != 0 {
		t.Fatalf("%d more statuses: %+v", len(seen), <-seen)
	}
}
