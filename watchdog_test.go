package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// pipelineCounter is a go-redis hook that counts pipelines and the
// commands in them.
type pipelineCounter struct {
	pipelines, commands atomic.Int64
}

func (p *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (p *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !isRenewal(cmds) { // the handshake, or acquisitions and releases
			return next(ctx, cmds)
		}
		p.pipelines.Add(1)
		p.commands.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// isRenewal reports whether a pipeline is a batch of renewals.
func isRenewal(cmds []redis.Cmder) bool {
	if len(cmds) == 0 || len(cmds[0].Args()) < 2 {
		return false
	}
	switch cmds[0].Args()[1] {
	case extendScript.Hash(), sources[extendScript], extendHolders.Hash(), sources[extendHolders]:
		return true
	}
	return false
}

// requireNoSchedulers checks that no default Locker of NewRedisLock's
// locks has anything scheduled, a run under way, or its timer armed:
// nothing renews when nothing is held.
func requireNoSchedulers(t *testing.T) {
	t.Helper()
	waitFor(t, 10*time.Second, "default Lockers idle", func() bool {
		idle := true
		eachDefaultLocker(func(l *Locker) { idle = idle && l.renewals.Idle() })
		return idle
	})
}

// One batch, three outcomes: renewed, gone, taken. Each hold is decided by
// its own reply, and the renewals of all of them share pipelines.
func TestBatchDecidesPerKey(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := srv.Client(t)
	hook := &pipelineCounter{}
	c.AddHook(hook)
	ctx := context.Background()
	const n = 30
	locks := holdMany(t, c, "batch", n, 900*time.Millisecond)
	for i := 0; i < 10; i++ {
		admin.Del(ctx, locks[i].Key()) // gone
	}
	for i := 10; i < 20; i++ {
		admin.Set(ctx, locks[i].Key(), "someone-else", time.Minute) // taken
	}
	for i := 0; i < 20; i++ {
		waitDone(t, locks[i].Done(), locks[i].Key())
		if !errors.Is(locks[i].Err(), ErrLockLost) {
			t.Fatalf("%s: Err = %v, want ErrLockLost", locks[i].Key(), locks[i].Err())
		}
	}
	// 30 renewals decided in one or two round trips, not 30.
	if p := hook.pipelines.Load(); p > 2 {
		t.Fatalf("the first 30 renewals took %d round trips: not batched", p)
	}
	waitFor(t, 10*time.Second, "two more rounds of renewals", func() bool { return hook.pipelines.Load() >= 3 })
	for i := 20; i < n; i++ {
		if isClosed(locks[i].Done()) || admin.Get(ctx, locks[i].Key()).Val() != holderID(locks[i]) {
			t.Fatalf("%s: renewed lock lost: %v", locks[i].Key(), locks[i].Err())
		}
	}
	if v := admin.Get(ctx, locks[10].Key()).Val(); v != "someone-else" {
		t.Fatalf("the other owner's key became %q", v)
	}
	for _, rl := range locks {
		rl.Release() // the lost ones report their loss; the others release
	}
	requireNoSchedulers(t)
}

// SCRIPT FLUSH while thousands of locks renew in batches: the pipeline's
// NOSCRIPT replies are sent again with EVAL, and no hold is lost.
func TestBatchSurvivesScriptFlush(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := srv.Client(t)
	hook := &pipelineCounter{}
	c.AddHook(hook)
	ctx := context.Background()
	n := 10000
	if raceEnabled { // CI's 2 cores, shared with other packages: the batch alone took past the lease
		n = 2000
	}
	locks := holdMany(t, c, "flush", n, 3*time.Second)
	flushes := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		flushes++
	}
	if hook.pipelines.Load() < 4 {
		t.Fatalf("only %d rounds of renewals in 3s: the test tested nothing", hook.pipelines.Load())
	}
	if stats := admin.Info(ctx, "errorstats").Val(); !strings.Contains(stats, "errorstat_NOSCRIPT") {
		t.Fatalf("no NOSCRIPT reply: the EVAL fallback was not exercised\n%s", stats)
	}
	lost := 0
	for _, rl := range locks {
		if isClosed(rl.Done()) {
			lost++
			t.Logf("%s: %v", rl.Key(), rl.Err())
		}
	}
	callerErrs := 0
	for _, rl := range locks {
		if ok, err := rl.Release(); !ok || err != nil {
			callerErrs++
			t.Logf("Release %s: %v, %v", rl.Key(), ok, err)
		}
	}
	requireNoSchedulers(t)
	t.Logf("%d script calls in %d pipelines across %d flushes", hook.commands.Load(), hook.pipelines.Load(), flushes)
	recordFault(t, faultRow{
		Case:      "9. SCRIPT FLUSH under batched renewal",
		Injection: fmt.Sprintf("SCRIPT FLUSH every 20 ms for 3 s while %d locks (lease 3 s) renew in pipelines", n),
		Promise:   "zero holds lost, zero errors to callers (NOSCRIPT answered by EVAL in the same round)",
		Runs:      int64(n), Faults: int64(flushes), Violations: int64(lost + callerErrs),
	})
}

// A batch that fails whole (every connection cut, again and again within
// the lease) is transient for every hold in it.
func TestBatchFailingWholeIsTransient(t *testing.T) {
	srv := redisserver.Start(t)
	px := startProxy(t, srv.Addr)
	c := newClient(t, px.Addr())
	hook := &pipelineCounter{}
	c.AddHook(hook)
	locks := holdMany(t, c, "whole", 20, 1500*time.Millisecond)
	for range 4 {
		time.Sleep(300 * time.Millisecond)
		px.cutAll()
	}
	sent := hook.pipelines.Load()
	waitFor(t, 10*time.Second, "two rounds of renewals after the cuts", func() bool { return hook.pipelines.Load() >= sent+2 })
	for _, rl := range locks {
		if isClosed(rl.Done()) {
			t.Fatalf("%s lost: %v", rl.Key(), rl.Err())
		}
		mustRelease(t, rl)
	}
	if px.faults.Load() == 0 {
		t.Fatal("no connection was cut: the test tested nothing")
	}
	requireNoSchedulers(t)
}

// blockingPipelines is a go-redis hook that holds every pipeline until
// released: a batch of renewals stuck in the network.
type blockingPipelines struct {
	entered chan struct{}
	release chan struct{}
	once    atomic.Bool
}

func (b *blockingPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (b *blockingPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (b *blockingPipelines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !isRenewal(cmds) { // the handshake, or acquisitions and releases
			return next(ctx, cmds)
		}
		if b.once.CompareAndSwap(false, true) {
			close(b.entered)
		}
		<-b.release
		return next(ctx, cmds)
	}
}

// Release does not wait for a batch in flight, and no renewal extends the
// key after Release returns, whatever that batch does afterwards.
func TestReleaseDoesNotWaitForBatchInFlight(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	c := srv.Client(t)
	block := &blockingPipelines{entered: make(chan struct{}), release: make(chan struct{})}
	c.AddHook(block)
	rl := NewRedisLock(FromGoRedis(c), "inflight", WithExpiry(600*time.Millisecond))
	mustAcquire(t, rl)
	h := rl.cur
	waitDone(t, block.entered, "a renewal batch in flight")
	if !watchRunning(rl, h) {
		t.Fatal("the hold is not marked in flight")
	}
	mustRelease(t, rl) // returns while the batch is stuck
	if !watchRunning(rl, h) {
		t.Fatal("the batch finished: the test proves nothing")
	}
	if admin.Exists(context.Background(), "inflight").Val() != 0 {
		t.Fatal("Release did not delete the key")
	}
	close(block.release) // the stuck renewal reaches the server now
	waitFor(t, 10*time.Second, "the batch over", func() bool { return !watchRunning(rl, h) })
	if admin.Exists(context.Background(), "inflight").Val() != 0 {
		t.Fatal("the renewal in flight brought the key back")
	}
	if rl.Err() != nil {
		t.Fatalf("Err = %v after a clean release", rl.Err())
	}
	requireNoSchedulers(t)
}

// Locks of one Locker, and locks of NewRedisLock on one store, share a
// scheduler; one that holds nothing is forgotten.
func TestSchedulersAreSharedAndForgotten(t *testing.T) {
	_, c := newMini(t)
	a := NewRedisLock(FromGoRedis(c), "a")
	b := NewRedisLock(FromGoRedis(c), "b")
	mustAcquire(t, a)
	mustAcquire(t, b)
	if a.locker.renewals == nil || a.locker.renewals != b.locker.renewals {
		t.Fatal("two locks of one store do not share a scheduler")
	}
	l := NewLocker(FromGoRedis(c))
	x, y := l.NewLock("x"), l.NewLock("y")
	mustAcquire(t, x)
	mustAcquire(t, y)
	if x.locker.renewals != y.locker.renewals || x.locker.renewals == a.locker.renewals {
		t.Fatal("a Locker's locks do not share its own scheduler")
	}
	for _, rl := range []*RedisLock{a, b, x, y} {
		mustRelease(t, rl)
	}
	requireNoSchedulers(t)
	if n := x.locker.renewals.Len(); n != 0 {
		t.Fatalf("%d holds left in the Locker's queue", n)
	}
}

// Found by the third black-box review: when many holds were released while
// a batch of renewals was in the network, the scheduler undid each released
// hold's renewal with a round trip of its own, on its own path, and stalled
// until the holds it kept had run out of lease (4 runs of 4 with a 20 ms
// delay on requests). Releases that deleted their keys need no undo, and no
// undo delays the scheduler.
func TestReleasesDuringBatchDoNotStallTheScheduler(t *testing.T) {
	srv := redisserver.Start(t)
	px := startProxy(t, srv.Addr)
	c := newClient(t, px.Addr())
	const n = 300
	locks := holdMany(t, c, "stall", n, 300*time.Millisecond)
	px.delayUp.Store(int64(20 * time.Millisecond)) // requests only
	var wg sync.WaitGroup
	for i := 0; i < n; i += 2 { // half released at random moments over 1.5 s
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(rand.N(1500 * time.Millisecond))
			locks[i].Release()
		}()
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	lost := 0
	for i := 1; i < n; i += 2 {
		if isClosed(locks[i].Done()) {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d kept holds lost while others were released", lost, n/2)
	}
	px.delayUp.Store(0)
	for i := 1; i < n; i += 2 {
		mustRelease(t, locks[i])
	}
	requireNoSchedulers(t)
}

// Acquisitions that each waited past their first renewal (for a connection
// from a busy pool, say) and arrive one after another share a renewal
// batch: the first runs the scheduler, and the others come due a thirtieth
// of their lease later, together, instead of a round trip each.
func TestOverdueRenewalsShareABatch(t *testing.T) {
	_, c := newMini(t)
	for _, script := range []*redis.Script{acquireScript, extendScript} { // no NOSCRIPT, no EVAL
		if err := script.Load(context.Background(), c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	gate := &acquireGate{open: make(chan struct{})}
	batches := &pipelineCounter{}
	c.AddHook(gate)
	c.AddHook(batches)
	clk := newFakeClock()
	l := NewLocker(FromGoRedis(c), withClock(clk))
	defer l.Close()
	const n, lease = 20, 3 * time.Second
	locks := make([]*RedisLock, n)
	acquired := make(chan struct{}, n)
	for i := range locks {
		locks[i] = l.NewLock(fmt.Sprintf("burst:%d", i), WithExpiry(lease))
		go func() { mustAcquire(t, locks[i]); acquired <- struct{}{} }()
	}
	waitFor(t, 10*time.Second, "every acquisition sent", func() bool { return gate.waiting.Load() == n })
	clk.Advance(lease/3 + 10*time.Millisecond) // every first renewal is overdue now
	gate.open <- struct{}{}
	<-acquired
	waitFor(t, 10*time.Second, "the first hold's renewal", func() bool { return batches.pipelines.Load() == 1 })
	for range n - 1 {
		gate.open <- struct{}{}
		<-acquired
	}
	waitFor(t, 10*time.Second, "no run under way", func() bool { return clk.Busy() == 0 })
	if p := batches.pipelines.Load(); p != 1 {
		t.Fatalf("%d renewal round trips for %d holds arriving overdue: not shared", p, n)
	}
	clk.Advance(lease / 30)
	waitFor(t, 10*time.Second, "the others' renewal", func() bool { return batches.pipelines.Load() == 2 })
	if cmds := batches.commands.Load(); cmds != 2 {
		t.Fatalf("%d renewal calls in 2 round trips, want one script call each", cmds)
	}
	for _, rl := range locks {
		mustRelease(t, rl)
	}
}

// acquireGate is a go-redis hook that holds every acquisition until the
// test lets it through.
type acquireGate struct {
	waiting atomic.Int64
	open    chan struct{}
}

func (g *acquireGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *acquireGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && args[1] == acquireScript.Hash() {
			g.waiting.Add(1)
			<-g.open
		}
		return next(ctx, cmd)
	}
}
func (g *acquireGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// holdMany makes n locks of c on prefix:0..n-1 with lease, and acquires
// them all at once, so that their renewals fall due together. An
// acquisition whose reply came after its lease (a loaded machine: the
// tests are of renewals) is made again.
func holdMany(t *testing.T, c *redis.Client, prefix string, n int, lease time.Duration) []*RedisLock {
	t.Helper()
	locks := make([]*RedisLock, n)
	var wg sync.WaitGroup
	for i := range locks {
		locks[i] = NewRedisLock(FromGoRedis(c), fmt.Sprintf("%s:%d", prefix, i), WithExpiry(lease))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for try := 1; ; try++ {
				ok, err := locks[i].Acquire()
				if try < 3 && !ok && errors.Is(err, ErrLockLost) {
					continue
				}
				if !ok || err != nil {
					t.Errorf("Acquire(%q) = %v, %v; want true, nil", locks[i].Key(), ok, err)
				}
				return
			}
		}()
	}
	wg.Wait()
	return locks
}
