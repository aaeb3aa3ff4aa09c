package redislock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	zredis "github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock/internal/redisserver"
)

// The fault suite: each case injects faults into real redis-server processes
// and records what it promised, how many faults it injected and how many
// times the promise was broken (which must be zero). TestMain prints the
// table after the run.

type faultRow struct {
	Case, Injection, Promise string
	Runs, Faults, Violations int64
	Measured                 bool // the violations are measured, not promised against: they fail nothing
}

var faultReport struct {
	sync.Mutex
	rows    []faultRow
	summary []string // the nemesis's, printed after the table
}

// recordFault adds a row to the report and fails t on any violation.
func recordFault(t *testing.T, row faultRow) {
	t.Helper()
	faultReport.Lock()
	faultReport.rows = append(faultReport.rows, row)
	faultReport.Unlock()
	t.Logf("%s: %d runs, %d faults injected, %d violations", row.Case, row.Runs, row.Faults, row.Violations)
	if row.Violations != 0 && !row.Measured {
		t.Errorf("%s: %d violations of: %s", row.Case, row.Violations, row.Promise)
	}
}

// faultCount counts the runs of a fault case and its violations, each
// reported by violate.
type faultCount struct {
	t                *testing.T
	runs, violations int64
}

// replyDropped runs call while px drops the next reply of the server,
// and counts a run; a call whose reply was not dropped fails the test,
// which would test nothing.
func (fc *faultCount) replyDropped(px *faultProxy, what string, call func()) {
	fc.t.Helper()
	before := px.replyDrops.Load()
	px.dropReplies.Store(1)
	call()
	px.dropReplies.Store(0)
	fc.runs++
	if px.replyDrops.Load() == before {
		fc.t.Fatalf("%s: no reply was dropped: the case tests nothing", what)
	}
}

// retryingStores makes, each on demand, a go-redis client (MaxRetries 3),
// go-zero's store and another go-redis client's AutoPipeliner, all through
// px: the clients that send a call again when its reply is lost (the
// pipeliner sends its whole batch again).
func retryingStores(t *testing.T, px *faultProxy) map[string]func() Scripter {
	return map[string]func() Scripter{
		"go-redis": func() Scripter {
			c := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: 3})
			t.Cleanup(func() { _ = c.Close() })
			return FromGoRedis(c)
		},
		"go-zero": func() Scripter { return goZeroStore(t, px.Addr()) },
		"go-redis AutoPipeliner": func() Scripter {
			c := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: 3})
			t.Cleanup(func() { _ = c.Close() })
			return FromGoRedis(autoPipeline(t, c))
		},
	}
}

func (fc *faultCount) violate(format string, args ...any) {
	fc.t.Helper()
	fc.violations++
	fc.t.Errorf(format, args...)
}

func printFaultReport(w io.Writer) {
	faultReport.Lock()
	defer faultReport.Unlock()
	if len(faultReport.rows) == 0 {
		return
	}
	rows := append([]faultRow(nil), faultReport.rows...)
	number := func(c string) int { // "10. ..." sorts after "9b. ..."
		n, _ := strconv.Atoi(strings.TrimRight(strings.SplitN(c, ".", 2)[0], "ab"))
		return n
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if a, b := number(rows[i].Case), number(rows[j].Case); a != b {
			return a < b
		}
		return rows[i].Case < rows[j].Case
	})
	fmt.Fprintf(w, "\nFault suite (real %s):\n", redisserver.Name())
	fmt.Fprintln(w, "| case | injected | promise | runs | faults | violations |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, r := range rows {
		violations := strconv.FormatInt(r.Violations, 10)
		if r.Measured {
			violations += " (measured, not promised)"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d | %d | %s |\n", r.Case, r.Injection, r.Promise, r.Runs, r.Faults, violations)
	}
	for _, line := range faultReport.summary {
		fmt.Fprintln(w, line)
	}
}

// flushFor is how long flushLoad flushes. go-zero's breaker grows more
// sensitive as failing 250ms buckets accumulate in its 10s window.
const flushFor = time.Second

// locker is what both our RedisLock and go-zero's have.
type locker interface {
	AcquireCtx(ctx context.Context) (bool, error)
	ReleaseCtx(ctx context.Context) (bool, error)
}

// flushLoad runs 32 goroutines locking and unlocking for flushFor, 4 per key
// on 8 keys, while 8 goroutines empty the script cache with SCRIPT FLUSH
// back to back. It
// counts errors, acquisitions and releases that failed (leaked locks).
func flushLoad(t *testing.T, srv *redisserver.Server, prefix string, newLock func(key string) locker) (errs, acquired, leaked, flushes int64) {
	admin := srv.Client(t)
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var nErrs, nAcq, nLeak atomic.Int64
	for g := 0; g < 32; g++ {
		l := newLock(fmt.Sprintf("%s:%d", prefix, g%8))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				ok, err := l.AcquireCtx(ctx)
				if err != nil {
					nErrs.Add(1)
					continue
				}
				if !ok {
					continue
				}
				nAcq.Add(1)
				if ok, err := l.ReleaseCtx(ctx); err != nil || !ok {
					nLeak.Add(1)
					if err != nil {
						nErrs.Add(1)
					}
				}
			}
		}()
	}
	var nFlush atomic.Int64
	var flushers sync.WaitGroup
	deadline := time.Now().Add(flushFor)
	for f := 0; f < 8; f++ { // enough to empty the cache between most calls
		flushers.Add(1)
		go func() {
			defer flushers.Done()
			for time.Now().Before(deadline) {
				if err := admin.ScriptFlush(ctx).Err(); err != nil {
					t.Error(err)
					return
				}
				nFlush.Add(1)
			}
		}()
	}
	flushers.Wait()
	close(stop)
	wg.Wait()
	return nErrs.Load(), nAcq.Load(), nLeak.Load(), nFlush.Load()
}

func TestFaultScriptFlushUnderGoZeroStore(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ours := goZeroStore(t, srv.Addr)
	noscript0 := errorCount(t, admin, "NOSCRIPT")
	var locks []*RedisLock
	var mu sync.Mutex
	errs, acquired, leaked, flushes := flushLoad(t, srv, "ours", func(key string) locker {
		rl := NewRedisLock(ours, key)
		mu.Lock()
		locks = append(locks, rl)
		mu.Unlock()
		return rl
	})
	lost := int64(0)
	for _, rl := range locks {
		if rl.Err() != nil {
			lost++
		}
	}
	left := int64(len(admin.Keys(context.Background(), "ours:*").Val()))
	noscript1 := errorCount(t, admin, "NOSCRIPT")

	t.Logf("redislock through go-zero's store: %d acquisitions, %d errors, %d leaked locks, %d lost holds, %d keys left, %d NOSCRIPT replies, under %d SCRIPT FLUSH",
		acquired, errs, leaked, lost, left, noscript1-noscript0, flushes)
	if raceEnabled {
		// go-zero v1.10.3's breaker reads its error window unlocked when
		// it logs an open breaker (breaker.go, errorWindow.String): a data
		// race of go-zero's own, which its lock hits here.
		t.Log("go-zero's RedisLock for contrast: skipped under the race detector")
	} else {
		// The same load on go-zero's own RedisLock, with a store of its own
		// (and so a circuit breaker of its own), for contrast.
		theirs := goZeroStore(t, srv.Addr)
		zErrs, zAcquired, zLeaked, zFlushes := flushLoad(t, srv, "theirs", func(key string) locker {
			l := zredis.NewRedisLock(theirs, key)
			l.SetExpire(10)
			return l
		})
		t.Logf("go-zero's RedisLock:               %d acquisitions, %d errors, %d leaked locks, %d NOSCRIPT replies, under %d SCRIPT FLUSH",
			zAcquired, zErrs, zLeaked, errorCount(t, admin, "NOSCRIPT")-noscript1, zFlushes)
	}
	if acquired == 0 {
		t.Fatal("no acquisition at all")
	}
	recordFault(t, faultRow{
		Case:      "6. SCRIPT FLUSH, 32 goroutines, go-zero store",
		Injection: "SCRIPT FLUSH back to back from 8 connections for 1s",
		Promise:   "no errors, no leaked locks, no lost holds; no NOSCRIPT for go-zero's breaker to count",
		Runs:      acquired, Faults: flushes, Violations: errs + leaked + lost + left + noscript1 - noscript0,
	})
}

// errorCount reads how many errors with prefix the server has replied,
// from INFO errorstats (a line such as errorstat_NOSCRIPT:count=3).
func errorCount(t *testing.T, c *redis.Client, prefix string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "errorstat_"+prefix+":count="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// pause injects a server-wide pause of d through admin: DEBUG SLEEP (the
// server stops, as in a long fork or a stuck disk) or CLIENT PAUSE (clients
// stop being served). It returns when the pause is over.
func pause(t *testing.T, admin *redis.Client, how string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	switch how {
	case "DEBUG SLEEP":
		if err := admin.Do(ctx, "DEBUG", "SLEEP", fmt.Sprintf("%.3f", d.Seconds())).Err(); err != nil {
			t.Fatal(err)
		}
	case "CLIENT PAUSE":
		if err := admin.Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(d)
	}
}

func TestFaultPauses(t *testing.T) {
	srv := redisserver.Start(t)
	c, admin := srv.Client(t), srv.Client(t)
	ctx := context.Background()
	for _, how := range []string{"DEBUG SLEEP", "CLIENT PAUSE"} {
		// Shorter than the lease: the lock survives.
		var runs, violations int64
		for i := 0; i < 3; i++ {
			rl := NewRedisLock(FromGoRedis(c), "paused", WithExpiry(time.Second))
			mustAcquire(t, rl)
			time.Sleep(time.Duration(i) * 150 * time.Millisecond) // at different points of the renewal cycle
			pause(t, admin, how, 500*time.Millisecond)
			time.Sleep(400 * time.Millisecond) // renewals go on after it
			runs++
			if isClosed(rl.Done()) || admin.Get(ctx, "paused").Val() != holderID(rl) {
				violations++
				t.Logf("%s 0.5s under a 1s lease: lost: %v", how, rl.Err())
			}
			rl.Release()
		}
		recordFault(t, faultRow{
			Case: "3a. " + how + " shorter than the lease", Injection: how + " 0.5s, lease 1s",
			Promise: "no loss", Runs: runs, Faults: runs, Violations: violations,
		})

		// Longer than the lease: the loss is reported by the time the pause
		// ends, and the key does not stay ours.
		runs, violations = 0, 0
		for i := 0; i < 3; i++ {
			rl := NewRedisLock(FromGoRedis(c), "paused", WithExpiry(300*time.Millisecond))
			mustAcquire(t, rl)
			id := holderID(rl)
			pause(t, admin, how, time.Second)
			runs++
			if !isClosed(rl.Done()) || !errors.Is(rl.Err(), ErrLockLost) {
				violations++
				t.Logf("%s 1s under a 300ms lease: still held at the end of the pause (Err %v)", how, rl.Err())
			}
			for deadline := time.Now().Add(5 * time.Second); admin.Get(ctx, "paused").Val() == id; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					violations++
					t.Logf("%s: the key still holds the lost holder's id 5s on", how)
					break
				}
			}
			rl.Release()
		}
		recordFault(t, faultRow{
			Case: "3b. " + how + " longer than the lease", Injection: how + " 1s, lease 300ms",
			Promise: "loss reported by the end of the pause; key not kept", Runs: runs, Faults: runs, Violations: violations,
		})
	}
}

func TestFaultRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		survive bool
	}{
		{"no persistence", nil, false},
		{"appendonly, fsync always", []string{"--appendonly", "yes", "--appendfsync", "always"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redisserver.Start(t, tc.args...)
			c, admin := srv.Client(t), srv.Client(t)
			var runs, violations int64
			for i := 0; i < 6; i++ {
				s := newSpy(FromGoRedis(c))
				opts := []Option{WithExpiry(1500 * time.Millisecond)}
				if i%2 == 1 { // a semaphore's holder (issue 28)
					opts = append(opts, WithPermits(2))
				}
				rl := NewRedisLock(s, "restarted", opts...)
				mustAcquire(t, rl)
				srv.Restart(t)
				runs++
				// Two renewals that got through, or the end of the hold
				// (a holder's renewals are extend_holders.lua's).
				renewals := func() int { return s.count(extendScript) + s.count(extendHolders) }
				before := renewals()
				waitFor(t, 30*time.Second, "renewals after the restart", func() bool {
					return isClosed(rl.Done()) || renewals() >= before+3
				})
				if tc.survive {
					for !isClosed(rl.Done()) && rl.Until().Before(time.Now().Add(time.Second)) {
						time.Sleep(20 * time.Millisecond) // until a renewal after the restart succeeded
					}
				} else {
					select {
					case <-rl.Done():
					case <-time.After(10 * time.Second):
					}
				}
				held := !isClosed(rl.Done())
				switch {
				case tc.survive && (!held || admin.Get(context.Background(), "restarted").Val() != holderID(rl) &&
					admin.ZScore(context.Background(), relatedName("restarted", "holders"), holderID(rl)).Err() != nil):
					violations++
					t.Logf("run %d: lost across a restart with fsync always: %v", i, rl.Err())
				case !tc.survive && (held || !errors.Is(rl.Err(), ErrLockLost)):
					violations++
					t.Logf("run %d: still believes it holds a key the restart erased", i)
				}
				rl.Release()
			}
			promise := "loss reported (never believes it holds an erased key)"
			if tc.survive {
				promise = "the lock survives"
			}
			recordFault(t, faultRow{
				Case: "2. restart, " + tc.name, Injection: "kill -9 and restart redis-server, lease 1.5s; locks, and semaphores' holders",
				Promise: promise, Runs: runs, Faults: runs, Violations: violations,
			})
		})
	}
}

func TestFaultHolderPausedPastLease(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	const lease = time.Second
	var runs, violations int64
	for i := 0; i < 3; i++ {
		key := fmt.Sprintf("paused-holder:%d", i)
		child, lines := startChild(t, "paused-holder", "REDIS_ADDR="+srv.Addr, "LOCK_KEY="+key, "LOCK_LEASE="+lease.String())
		oldToken := parseInt(t, expectLine(t, lines, "acquired")[0])

		if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(lease + 500*time.Millisecond)
		next := NewRedisLock(FromGoRedis(c), key, WithFencing())
		if err := next.AcquireWait(context.Background()); err != nil {
			t.Fatalf("the next holder: %v", err)
		}
		newToken := next.Token()
		if n, err := fenceWrite.Run(context.Background(), c, []string{key + ":resource"}, newToken).Int(); err != nil || n != 1 {
			t.Fatalf("the new holder's write: %v, %v", n, err)
		}
		if err := child.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		f := expectLine(t, lines, "lost")
		afterResume, isLoss, staleAccepted := parseInt(t, f[0]), f[1] == "true", f[2] == "true"
		runs++
		if afterResume > int64(lease/3/time.Millisecond) || !isLoss || staleAccepted || newToken <= oldToken {
			violations++
		}
		t.Logf("run %d: Done closed %dms after resuming (renewal interval %v), ErrLockLost %v, stale write accepted %v, tokens %d then %d",
			i, afterResume, lease/3, isLoss, staleAccepted, oldToken, newToken)
		if err := child.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
		mustRelease(t, next)
	}
	recordFault(t, faultRow{
		Case: "1. holder paused past its lease", Injection: "SIGSTOP a holder process for 1.5s, lease 1s",
		Promise: "Done within one renewal interval of resuming, ErrLockLost, its fenced write refused, the next token higher",
		Runs:    runs, Faults: runs, Violations: violations,
	})
}

func TestFaultHammer(t *testing.T) {
	t.Run("plain", func(t *testing.T) { hammer(t, "5. hammer, 4 processes x 16 goroutines", 40_000, false) })
	t.Run("fair", func(t *testing.T) { hammer(t, "5b. hammer, fair locks, 4 processes x 16 goroutines", 10_000, true) })
}

// hammer runs total fenced read-modify-writes under the locks of 4 child
// processes of 16 goroutines each, on 4 keys, fair or plain, and checks
// the counters and the history.
func hammer(t *testing.T, name string, total int, fair bool) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	const processes, goroutines, keys = 4, 16, 4
	start := time.Now()
	type child struct {
		cmd   *exec.Cmd
		lines *bufio.Scanner
	}
	var children []child
	var histories []string
	for p := 0; p < processes; p++ {
		history := filepath.Join(t.TempDir(), "history")
		histories = append(histories, history)
		cmd, lines := startChild(t, "hammer", "REDIS_ADDR="+srv.Addr,
			fmt.Sprintf("HAMMER_KEYS=%d", keys), fmt.Sprintf("HAMMER_GOROUTINES=%d", goroutines),
			fmt.Sprintf("HAMMER_ACQUISITIONS=%d", total/processes),
			fmt.Sprintf("HAMMER_CLIENT=%d", p*goroutines), "HAMMER_HISTORY="+history, fmt.Sprintf("HAMMER_FAIR=%s", map[bool]string{true: "1"}[fair]))
		children = append(children, child{cmd, lines})
	}
	var accepted, refused, failed int64
	for _, ch := range children {
		f := expectLine(t, ch.lines, "done")
		accepted += parseInt(t, f[0])
		refused += parseInt(t, f[1])
		failed += parseInt(t, f[2])
		if err := ch.cmd.Wait(); err != nil {
			t.Fatalf("hammer child: %v", err)
		}
	}
	var counted int64
	for k := 0; k < keys; k++ {
		n, err := c.HGet(context.Background(), fmt.Sprintf("hammer:%d:resource", k), "count").Int64()
		if err != nil {
			t.Fatal(err)
		}
		counted += n
	}
	elapsed := time.Since(start)
	t.Logf("%d acquisitions by %d processes x %d goroutines on %d keys in %v (%.0f/s): counters sum to %d, %d increments accepted, %d refused, %d errors",
		accepted+refused, processes, goroutines, keys, elapsed.Round(time.Millisecond), float64(accepted+refused)/elapsed.Seconds(), counted, accepted, refused, failed)
	lostUpdates := accepted - counted
	if lostUpdates < 0 {
		lostUpdates = -lostUpdates
	}
	var ops []fencedOp
	for _, path := range histories {
		mine, err := readOps(path)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, mine...)
	}
	unlinearizable := int64(0)
	if int64(len(ops)) != accepted+refused {
		t.Errorf("%d operations recorded, %d made", len(ops), accepted+refused)
		unlinearizable++
	}
	checked := time.Now()
	if report := checkHistory(ops, 2*time.Minute); report != "" {
		t.Error(report)
		unlinearizable++
	}
	t.Logf("history of %d fenced read-modify-writes checked by porcupine in %v", len(ops), time.Since(checked).Round(time.Millisecond))
	recordFault(t, faultRow{
		Case: name, Injection: fmt.Sprintf("%d fenced read-modify-writes on 4 keys", total),
		Promise: "counters equal the increments; no write out of token order; no error; the history of every read and write is linearizable (porcupine)",
		Runs:    accepted + refused, Faults: 0, Violations: lostUpdates + refused + failed + max(0, int64(total)-accepted-refused) + unlinearizable,
	})
}

// proxyWrite is the resource of case 4: it accepts a write only with a
// token higher than any before, and lists the accepted tokens in order.
var proxyWrite = redis.NewScript(`
local highest = tonumber(redis.call("GET", KEYS[1]) or "0")
if tonumber(ARGV[1]) <= highest then
  return 0
end
redis.call("SET", KEYS[1], ARGV[1])
redis.call("RPUSH", KEYS[2], ARGV[1])
return 1`)

func TestFaultFlakyNetwork(t *testing.T) {
	t.Run("go-redis", func(t *testing.T) { flakyNetwork(t, "4. delays, drops and cuts (TCP proxy)", false) })
	t.Run("AutoPipeliner", func(t *testing.T) {
		flakyNetwork(t, "4b. delays, drops and cuts (TCP proxy), through an AutoPipeliner", true)
	})
}

// flakyNetwork runs case 4: the locks' calls through a go-redis client,
// or its AutoPipeliner (all of them then share its batches: a cut or a
// delay meets every call in flight at once, and a wait given up may leave
// its attempt in a batch).
func flakyNetwork(t *testing.T, name string, pipelined bool) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	px := startProxy(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: px.Addr(), DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, PoolSize: 32})
	t.Cleanup(func() { _ = c.Close() })
	var s redis.Scripter = c
	if pipelined {
		s = autoPipeline(t, c)
	}

	type belief struct {
		from, to time.Time
		token    int64
	}
	var (
		mu      sync.Mutex
		beliefs []belief
		holds   atomic.Int64
		refused atomic.Int64
		stop    atomic.Bool
		wg      sync.WaitGroup
	)
	for g := 0; g < 8; g++ {
		rl := NewRedisLock(FromGoRedis(s), "flaky", WithExpiry(300*time.Millisecond), WithFencing())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				// Wait at most a second; the same ctx binds the hold, so
				// the timer that ends the wait is stopped once it is ours.
				ctx, cancel := context.WithCancel(context.Background())
				giveUp := time.AfterFunc(time.Second, cancel)
				err := rl.AcquireWait(ctx)
				giveUp.Stop()
				if err != nil {
					cancel()
					continue
				}
				from, token := time.Now(), rl.Token()
				until := rl.Until()
				wrote := false
				for work := time.Duration(rand.Int64N(int64(200 * time.Millisecond))); time.Since(from) < work; time.Sleep(2 * time.Millisecond) {
					if u := rl.Until(); !u.IsZero() {
						until = u
					}
					if isClosed(rl.Done()) || !time.Now().Before(until) {
						break // no longer ours by our own accounting
					}
					if !wrote { // one fenced write per hold, while we believe we hold
						wrote = true
						n, err := proxyWrite.Run(context.Background(), c, []string{"flaky:highest", "flaky:log"}, token).Int()
						if err == nil && n == 0 {
							refused.Add(1)
						}
					}
				}
				to := time.Now()
				if until.Before(to) {
					to = until
				}
				rl.Release()
				cancel()
				mu.Lock()
				beliefs = append(beliefs, belief{from, to, token})
				mu.Unlock()
				holds.Add(1)
			}
		}()
	}
	// The injector: every 400ms a fault for 200ms, then 200ms of calm, for
	// at least 6s and until 20 holds have run (at most 30s), so that slow
	// phases drawn back to back cannot leave the case untested.
	calm := func() { px.delay.Store(0); px.dropPerK.Store(0) }
	phases := []func(){
		func() { px.delay.Store(int64(20 * time.Millisecond)) },
		func() { px.delay.Store(int64(150 * time.Millisecond)) },
		func() { px.delay.Store(int64(500 * time.Millisecond)) }, // longer than the lease
		func() { px.delay.Store(0); px.dropPerK.Store(50) },
		func() { px.cutAll() },
	}
	start := time.Now()
	for since := time.Duration(0); since < 6*time.Second || (holds.Load() < 20 && since < 30*time.Second); since = time.Since(start) {
		phases[rand.IntN(len(phases))]()
		time.Sleep(200 * time.Millisecond)
		calm()
		time.Sleep(200 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()

	// No two beliefs overlap.
	sort.Slice(beliefs, func(i, j int) bool { return beliefs[i].from.Before(beliefs[j].from) })
	var overlaps int64
	var latest belief
	for _, b := range beliefs {
		if b.from.Before(latest.to) {
			overlaps++
			t.Logf("token %d believed it held from %v while token %d did until %v",
				b.token, b.from.Format("15:04:05.000000"), latest.token, latest.to.Format("15:04:05.000000"))
		}
		if b.to.After(latest.to) {
			latest = b
		}
	}
	// The resource accepted tokens in strictly increasing order.
	var outOfOrder int64
	accepted := admin.LRange(context.Background(), "flaky:log", 0, -1).Val()
	for i := 1; i < len(accepted); i++ {
		prev, _ := strconv.ParseInt(accepted[i-1], 10, 64)
		cur, _ := strconv.ParseInt(accepted[i], 10, 64)
		if cur <= prev {
			outOfOrder++
		}
	}
	t.Logf("%d holds, %d fenced writes accepted, %d stale writes refused, %d faults injected", len(beliefs), len(accepted), refused.Load(), px.faults.Load())
	if len(beliefs) < 10 {
		t.Fatalf("only %d holds in %v: the test tested nothing", len(beliefs), time.Since(start))
	}
	recordFault(t, faultRow{
		Case: name, Injection: "200ms faults between 200ms of calm: chunks delayed 20-500ms, 5% of chunks dropping the connection, all connections cut; lease 300ms",
		Promise: "no two holders believe they hold at once by their own Until; fenced writes strictly increase",
		Runs:    int64(len(beliefs)), Faults: px.faults.Load(), Violations: overlaps + outOfOrder,
	})
}

// Case 8 (issue 8, bug 2): the server runs a script and its reply is lost
// (the proxy closes the connection instead of forwarding it); the client
// retries on a new connection, as go-redis and go-zero do by default. Each
// kind of script must still tell the truth: an acquisition that took the
// lock has it (with the token it minted), a re-entry and a renewal keep it,
// and a release that deleted the key is a release, not a loss.
func TestFaultReplyLostAfterScriptRan(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	px := startProxy(t, srv.Addr)
	stores := retryingStores(t, px)
	ctx := context.Background()
	fc := &faultCount{t: t}
	for name, newStore := range stores {
		store := newStore()
		for round := range 5 {
			key := fmt.Sprintf("lost-reply:%s:%d", name, round)
			rl := NewRedisLock(store, key, WithFencing(), WithExpiry(30*time.Second))
			warm := NewRedisLock(store, key+":warm") // a pooled connection, so the drop hits the script's reply
			if ok, err := warm.Acquire(); !ok || err != nil {
				t.Fatal(ok, err)
			}
			mustRelease(t, warm)

			fc.replyDropped(px, "acquire", func() {
				if ok, err := rl.Acquire(); !ok || err != nil {
					fc.violate("%s: Acquire on a free lock after a lost reply = %v, %v", key, ok, err)
				}
			})
			if v := admin.Get(ctx, key).Val(); v != holderID(rl) {
				fc.violate("%s: key holds %q, not our id", key, v)
			}
			if counter := admin.Get(ctx, relatedName(key, "fence")).Val(); counter != strconv.FormatInt(rl.Token(), 10) {
				fc.violate("%s: token %d, counter %s", key, rl.Token(), counter)
			}
			fc.replyDropped(px, "re-entry", func() {
				if ok, err := rl.Acquire(); !ok || err != nil {
					fc.violate("%s: re-entry after a lost reply = %v, %v", key, ok, err)
				}
			})
			fc.replyDropped(px, "ttl", func() {
				if ttl, err := rl.TTL(ctx); err != nil || ttl <= 0 {
					fc.violate("%s: TTL after a lost reply = %v, %v", key, ttl, err)
				}
			})
			mustRelease(t, rl) // the inner one: no round trip
			fc.replyDropped(px, "release", func() {
				if ok, err := rl.Release(); !ok || err != nil {
					fc.violate("%s: Release after a lost reply = %v, %v", key, ok, err)
				}
			})
			if admin.Exists(ctx, key).Val() != 0 || rl.Err() != nil {
				fc.violate("%s: after release, key exists %d, Err %v", key, admin.Exists(ctx, key).Val(), rl.Err())
			}

			// A lease long enough for the client's reconnect and retry under
			// -race on a loaded machine: the promise is about the lost reply,
			// not about how fast a retry gets through.
			spied := newSpy(store)
			renewed := NewRedisLock(spied, key+":renewed", WithExpiry(1500*time.Millisecond))
			mustAcquire(t, renewed)
			fc.replyDropped(px, "renewal", func() {
				waitFor(t, 10*time.Second, "a renewal's reply dropped", func() bool { return px.dropReplies.Load() <= 0 })
				after := spied.count(extendScript)
				waitFor(t, 10*time.Second, "two renewals after the dropped one", func() bool {
					return spied.count(extendScript) >= after+2 || isClosed(renewed.Done())
				})
			})
			if isClosed(renewed.Done()) || admin.Get(ctx, key+":renewed").Val() != holderID(renewed) {
				fc.violate("%s: renewal after a lost reply lost the lock: %v", key, renewed.Err())
			}
			if ok, err := renewed.Release(); !ok || err != nil {
				fc.violate("%s: release of the renewed lock = %v, %v", key, ok, err)
			}
		}
	}
	recordFault(t, faultRow{
		Case:      "8. reply lost after the script ran",
		Injection: "the proxy closes the connection instead of forwarding the reply of an acquire, re-entry, TTL, release or renewal; go-redis (plain and through an AutoPipeliner) and go-zero retry (MaxRetries 3)",
		Promise:   "an acquisition that ran has the lock, with its token; a release that ran is a release, not a loss; renewals and re-entries keep the lock",
		Runs:      fc.runs, Faults: px.replyDrops.Load(), Violations: fc.violations,
	})
}

// Found by the black-box review: an acquisition stalled in the network past
// its caller's timeout is given up, and its call reaches the server late,
// after another owner took and released the lock. It must not take the lock
// for an id nobody has. Counted in case 8.
func TestFaultLateAcquisitionTakesNothing(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	px := startProxy(t, srv.Addr)
	slow := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = slow.Close() })
	ctx := context.Background()
	var runs, violations int64
	for round := range 6 {
		var opts []Option
		if round%2 == 1 { // an attempt on a permit of a semaphore (issue 28)
			opts = []Option{WithPermits(1)}
		}
		key := fmt.Sprintf("late:%d", round)
		a := NewRedisLock(FromGoRedis(slow), key, append(opts, WithExpiry(5*time.Second))...)
		b := NewRedisLock(FromGoRedis(admin), key, opts...)
		mustAcquire(t, a) // loads the script and pools a connection
		mustRelease(t, a)

		px.stallNext.Store(int64(300 * time.Millisecond))
		stalled := px.stalled.Load()
		actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		ok, err := a.AcquireCtx(actx)
		cancel()
		if ok || err == nil {
			t.Fatalf("round %d: the stalled acquisition = %v, %v; want a timeout", round, ok, err)
		}
		mustAcquire(t, b) // another owner, while a's call is still in the network
		mustRelease(t, b)
		waitFor(t, 10*time.Second, "the stalled call delivered", func() bool { return px.stalled.Load() > stalled })
		time.Sleep(50 * time.Millisecond) // the server runs it
		runs++
		if n := admin.Exists(ctx, key).Val(); n != 0 {
			violations++
			t.Errorf("round %d: the late acquisition took the lock (or a permit): %s", round, keySpace(t, admin)[key])
		}
		c := NewRedisLock(FromGoRedis(admin), key, opts...)
		if ok, err := c.Acquire(); !ok || err != nil {
			violations++
			t.Errorf("round %d: a third owner is shut out: %v, %v", round, ok, err)
		} else {
			mustRelease(t, c)
		}
	}
	recordFault(t, faultRow{
		Case:      "8b. acquisition reaching the server after it was given up",
		Injection: "the proxy holds an acquisition (of a lock, or of a semaphore's only permit) 300 ms past its caller's 50 ms timeout; another owner takes and releases the lock meanwhile",
		Promise:   "the late acquisition takes nothing; the next owner acquires",
		Runs:      runs, Faults: runs, Violations: violations,
	})
}
