package redislock

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redislock/redislock/internal/clock"
	"github.com/redislock/redislock/internal/store"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if role := os.Getenv(childRoleEnv); role != "" { // a re-executed test binary
		os.Exit(runChild(role))
	}
	if !testing.Verbose() {
		logx.Disable() // the background logs are asserted through Err, not read
		slog.SetDefault(slog.New(slog.DiscardHandler))
		// SetDefault sent the log package's lines there too: keep them.
		// go-zero's logx.Must (MustNewRedis) says why it exits with one.
		log.SetOutput(os.Stderr)
	}
	logx.SetWriter(logx.NewWriter(os.Stderr)) // examples compare stdout
	code := m.Run()
	printFaultReport(os.Stdout)
	if path := os.Getenv("REDISLOCK_FAULT_REPORT"); path != "" { // .ci/run shows it
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			printFaultReport(f)
			f.Close()
		}
	}
	waitGiveBacks() // give-backs of abandoned attempts end within their timeout
	if code == 0 {
		if err := goleak.Find(goZeroInitGoroutines...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// waitGiveBacks waits for the background work (give-backs of abandoned
// attempts, self-releases) of every store's default Locker and of the
// locks given. No test runs in parallel with another.
func waitGiveBacks(rls ...*RedisLock) {
	eachDefaultLocker(func(l *Locker) { l.life.wg.Wait() })
	for _, rl := range rls {
		rl.locker.life.wg.Wait()
	}
}

// The scripts as the Scripter sees them, and their texts.
var (
	acquireScript     = store.Acquire.Script
	extendScript      = store.Extend.Script
	extendHolders     = store.ExtendHolders.Script
	releaseScript     = store.Release.Script
	fairAcquireScript = store.FairAcquire.Script
	fairReleaseScript = store.FairRelease.Script
	breakScript       = store.Break.Script
	sources           = func() map[*redis.Script]string {
		all := map[*redis.Script]string{}
		for _, s := range store.All() {
			all[s.Script] = s.Source()
		}
		return all
	}()
)

// goZeroInitGoroutines are started by go-zero's package init functions and
// live as long as the process: they are not ours to stop.
var goZeroInitGoroutines = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/zeromicro/go-zero/core/proc.init.1.func1"),
	goleak.IgnoreTopFunction("github.com/zeromicro/go-zero/core/stat.init.1.func1"),
}

// goZeroStore returns go-zero's store for addr, failing tb when it cannot
// connect (go-zero's MustNewRedis would end the whole test binary).
// DisableIdentity skips the CLIENT SETINFO handshake, which Redis before
// 7.2 refuses and go-zero's circuit breaker would count as a failure on
// every new connection.
func goZeroStore(tb testing.TB, addr string) *zredis.Redis {
	return goZeroStoreOf(tb, zredis.RedisConf{Host: addr, Type: zredis.NodeType, DisableIdentity: true})
}

// goZeroStoreOf returns go-zero's store of conf, failing tb when it cannot
// connect. go-zero keeps one client per address string for the process, made
// with the credentials of the first store of it; a store with credentials is
// therefore given a spelling of its loopback address that no store with other
// credentials used, so that a port a later server reuses cannot hand it (or a
// store without credentials) a client logged in for another server.
func goZeroStoreOf(tb testing.TB, conf zredis.RedisConf) *zredis.Redis {
	tb.Helper()
	if conf.User != "" || conf.Pass != "" {
		conf.Host = goZeroHost(tb, conf.Host, conf.User+"\x00"+conf.Pass)
	}
	z, err := zredis.NewRedis(conf)
	if err != nil {
		tb.Fatalf("go-zero's store of %s: %v", conf.Host, err)
	}
	return z
}

// goZeroHosts records the credentials each address string of a go-zero
// store with credentials was first used with.
var goZeroHosts = struct {
	sync.Mutex
	creds map[string]string
}{creds: map[string]string{}}

// goZeroHost returns a spelling of addr, a 127.0.0.1 address, that go-zero
// has not seen with credentials other than creds: never 127.0.0.1 itself,
// which stores without credentials use.
func goZeroHost(tb testing.TB, addr, creds string) string {
	tb.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" {
		tb.Fatalf("go-zero's store with credentials needs a 127.0.0.1 address, not %q", addr)
	}
	goZeroHosts.Lock()
	defer goZeroHosts.Unlock()
	for _, v6 := range []string{"::ffff:7f00:1", "0::ffff:7f00:1", "0:0::ffff:7f00:1", "0:0:0::ffff:7f00:1", "0:0:0:0::ffff:7f00:1"} {
		spelling := net.JoinHostPort(v6, port) // each 127.0.0.1
		if got, ok := goZeroHosts.creds[spelling]; !ok || got == creds {
			goZeroHosts.creds[spelling] = creds
			return spelling
		}
	}
	tb.Fatalf("every spelling of %s was used by go-zero with other credentials", addr)
	return ""
}

// withClock makes the lock use c as its time source.
func withClock(c clock.Clock) Option {
	return func(o *options) { o.clock = c }
}

// newClient returns a go-redis client of addr, closed with t.
func newClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newMini starts a miniredis and a go-redis client of it.
func newMini(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return mr, c
}

// watched is a lock held once on miniredis, with a 3 s lease, a fake clock
// and a spy between it and Redis.
type watched struct {
	mr  *miniredis.Miniredis
	clk *fakeClock
	spy *spy
	rl  *RedisLock
}

func newWatched(t *testing.T, key string, opts ...Option) watched {
	t.Helper()
	mr, c := newMini(t)
	w := watched{mr: mr, clk: newFakeClock(), spy: newSpy(FromGoRedis(c))}
	w.rl = NewRedisLock(w.spy, key, append([]Option{WithExpiry(3 * time.Second), withClock(w.clk)}, opts...)...)
	mustAcquire(t, w.rl)
	return w
}

// spy is a Scripter that counts the calls per script and can fail them.
type spy struct {
	next Scripter
	mu   sync.Mutex
	// fail, when set, is asked before each call; a non-nil error is
	// returned instead of running the script.
	fail  func(script *redis.Script) error
	reply any            // when set, returned instead of running the script
	calls map[string]int // by script hash
	total atomic.Int64
	ended atomic.Int64 // calls that have returned
}

func newSpy(next Scripter) *spy { return &spy{next: next, calls: map[string]int{}} }

func (s *spy) ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	s.total.Add(1)
	s.mu.Lock()
	s.calls[script.Hash()]++
	fail, reply := s.fail, s.reply
	s.mu.Unlock()
	if fail != nil {
		if err := fail(script); err != nil {
			return nil, err
		}
	}
	defer s.ended.Add(1)
	if reply != nil {
		return reply, nil
	}
	return s.next.ScriptRunCtx(ctx, script, keys, args...)
}

func (s *spy) count(script *redis.Script) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[script.Hash()]
}

func (s *spy) setFail(f func(*redis.Script) error) {
	s.mu.Lock()
	s.fail = f
	s.mu.Unlock()
}

func (s *spy) setReply(reply any) {
	s.mu.Lock()
	s.reply = reply
	s.mu.Unlock()
}

// replyStore answers every script with the reply and error it is given.
type replyStore struct {
	reply any
	err   error
}

func (r replyStore) ScriptRunCtx(context.Context, *redis.Script, []string, ...any) (any, error) {
	return r.reply, r.err
}

// waitDone waits for ch to close, failing after 10 s of real time.
func waitDone(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Done did not close within 10s", what)
	}
}

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// holderID returns the owner id of rl's current hold.
func holderID(rl *RedisLock) string {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.cur == nil {
		return ""
	}
	return rl.cur.id
}

func mustAcquire(t testing.TB, rl *RedisLock) {
	t.Helper()
	ok, err := rl.Acquire()
	if err != nil || !ok {
		t.Fatalf("Acquire(%q) = %v, %v; want true, nil", rl.Key(), ok, err)
	}
}

func mustRelease(t testing.TB, rl *RedisLock) {
	t.Helper()
	ok, err := rl.Release()
	if err != nil || !ok {
		t.Fatalf("Release(%q) = %v, %v; want true, nil", rl.Key(), ok, err)
	}
}

// releaseAll gives back every acquisition the locks still count, those of
// holds that ended included.
func releaseAll(rls ...*RedisLock) {
	for _, rl := range rls {
		for rl.Holds() > 0 || rl.Err() != nil {
			if _, err := rl.Release(); err == nil && rl.Holds() == 0 {
				break
			}
		}
	}
}

// watchRunning reports whether a run of h's watchdog is under way.
func watchRunning(rl *RedisLock, h *hold) bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return rl.locker.renewals.InFlight(h.renewal)
}

// scripterFunc is a Scripter made of a function.
type scripterFunc func(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error)

func (f scripterFunc) ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	return f(ctx, script, keys, args...)
}

// stuckRenewal is a store on c whose first renewal sticks in the network
// until unblock is closed, and then gets through all the same (its context
// no longer matters).
type stuckRenewal struct {
	c                *redis.Client
	entered, unblock chan struct{}
	renewals         atomic.Int64
}

func newStuckRenewal(c *redis.Client) *stuckRenewal {
	return &stuckRenewal{c: c, entered: make(chan struct{}), unblock: make(chan struct{})}
}

func (s *stuckRenewal) ScriptRunCtx(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	if (script == extendScript || script == extendHolders) && s.renewals.Add(1) == 1 {
		close(s.entered)
		<-s.unblock
		ctx = context.WithoutCancel(ctx)
	}
	return FromGoRedis(s.c).ScriptRunCtx(ctx, script, keys, args...)
}

// queuedHere reports whether AcquireWaits of this process queue for rl's
// key on rl's pub/sub client.
func queuedHere(rl *RedisLock) bool {
	queued, _ := rl.locker.wake.Waiting(rl, rl.opts.pubsub, rl.names.channel)
	return queued
}

// eachDefaultLocker calls f with every default Locker alive.
func eachDefaultLocker(f func(*Locker)) {
	d := &defaultLockers
	d.Lock()
	var all []*Locker
	for _, wl := range d.m {
		if l := wl.Value(); l != nil {
			all = append(all, l)
		}
	}
	d.Unlock()
	for _, l := range all {
		f(l)
	}
}
