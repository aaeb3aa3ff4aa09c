// Command benchmarks compares redislock with go-zero's RedisLock,
// bsm/redislock, redsync v4 and rueidislock on one redis-server that it
// starts, in one run, and writes results.md and chart.svg:
//
//	cd benchmarks && go run . [-quick]
//
// It needs redis-server in PATH. This is a module of its own, so that users
// of redislock do not download the other libraries.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
)

var (
	quick = flag.Bool("quick", false, "shorter runs, for a smoke test")
	held  = flag.String("held", "", "internal: run the held-locks scenario for this library against -addr")
	addr  = flag.String("addr", "", "internal: the Redis address for -held and -hot")
	hot   = flag.String("hot", "", "internal: run contenders of the hot-key scenario for this library against -addr")
	first = flag.Int("first", 1, "internal: the number of the first contender of -hot")
	count = flag.Int("contenders", 1, "internal: how many contenders -hot runs")
	from  = flag.Int64("from", 0, "internal: when -hot starts, in ns since the epoch")
	until = flag.Int64("until", 0, "internal: when -hot stops, in ns since the epoch")
	only  = flag.String("only", "", "run the hot key alone, for this library, and print its rows")
)

// hotProcesses is how many processes the contenders of the hot key are
// spread over.
const hotProcesses = 4

const heldLocks = 10_000

func main() {
	flag.Parse()
	logx.Disable() // go-zero's slow-call logs would drown the run
	if *held != "" {
		heldChild(*held, *addr)
		return
	}
	if *hot != "" {
		hotChild(*hot, *addr, *first, *count, time.Unix(0, *from), time.Unix(0, *until))
		return
	}
	srv, err := startRedis()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
	defer srv.Process.Kill()
	admin := redis.NewClient(&redis.Options{Addr: srv.addr})
	defer admin.Close()

	d := 3 * time.Second
	heldFor := 10 * time.Second
	if *quick {
		d, heldFor = 500*time.Millisecond, 2*time.Second
	}
	if *only != "" {
		for _, n := range []int{8, 32} {
			admin.FlushAll(context.Background())
			h := hotKey(*only, srv.addr, admin, n, d)
			fmt.Printf("%s, %d contenders: %.0f acq/s, %.0f changes/s, handoff p50 %s p99 %s, release call p50 %s, %.1f commands/acq, fairness %.2f\n",
				*only, n, h.perSec, h.switches, us(h.p50), us(h.p99), us(h.release), h.cmdsPer, h.minShare)
		}
		return
	}
	// Uncontended pairs are interleaved: rounds of d/rounds per library in
	// turn, so that the loopback's drift over the run (10-20%, and more on
	// a noisy day) hits every library alike.
	const rounds = 6
	measured := slices.Concat(libraryNames, pipelinedNames)
	pairs := map[string]*[2][]time.Duration{}
	for round := 0; round < rounds; round++ {
		for _, name := range measured {
			lib := newLibrary(name, srv.addr)
			if pairs[name] == nil {
				pairs[name] = &[2][]time.Duration{}
			}
			for i, g := range []int{1, 32} {
				admin.FlushAll(context.Background())
				pairs[name][i] = append(pairs[name][i], uncontended(lib, g, d/rounds)...)
			}
			lib.close()
		}
	}
	// Each library against the same round trips made with raw go-redis,
	// interleaved pair by pair, a new lock per pair.
	ratios := map[string]*[2][2]time.Duration{}
	for round := 0; round < rounds; round++ {
		for _, name := range libraryNames {
			lib := newLibrary(name, srv.addr)
			if ratios[name] == nil {
				ratios[name] = &[2][2]time.Duration{}
			}
			for i, g := range []int{1, 16} {
				admin.FlushAll(context.Background())
				raw, its := interleaved(lib, srv.addr, g, d/rounds)
				ratios[name][i][0] += raw
				ratios[name][i][1] += its
			}
			lib.close()
		}
	}
	// Saturation: all goroutines raw, then all with the library, in
	// alternating phases; time and redis-server CPU per pair of each. Ours
	// through an AutoPipeliner is against raw pairs through one.
	saturation := map[string]*[4]float64{} // raw time, its time, raw CPU, its CPU
	for round := 0; round < rounds; round++ {
		for _, name := range measured {
			lib, base := newLibrary(name, srv.addr), rawLibrary(srv.addr, name == pipelinedName)
			if saturation[name] == nil {
				saturation[name] = &[4]float64{}
			}
			admin.FlushAll(context.Background())
			for i, v := range saturated(base, lib, admin, d/rounds) {
				saturation[name][i] += v
			}
			lib.close()
			base.close()
		}
	}
	rtt := roundTrip(admin)
	// measuredRow is name's row of the uncontended and saturated runs.
	measuredRow := func(name string) row {
		r := row{lib: name}
		sat := saturation[name]
		r.saturated = [3]float64{sat[1] / sat[0], sat[3] / sat[2], sat[3] / rounds}
		for i := range r.uncontended {
			times := pairs[name][i]
			r.uncontended[i] = latency{perSec: float64(len(times)) / d.Seconds(), p50: pct(times, 50), p99: pct(times, 99)}
		}
		return r
	}
	var rows []row
	for _, name := range libraryNames {
		lib := newLibrary(name, srv.addr)
		r := measuredRow(name)
		for i, t := range ratios[name] {
			r.ratio[i] = float64(t[1]) / float64(t[0])
		}
		for i, n := range []int{8, 32} {
			admin.FlushAll(context.Background())
			r.hot[i] = hotKey(lib.name, srv.addr, admin, n, d)
		}
		lib.close()
		admin.FlushAll(context.Background())
		r.held = heldRun(lib.name, srv.addr, admin, heldFor)
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "%s done\n", lib.name)
	}
	// Fair locks take part in the hot key only: elsewhere they are the
	// plain locks.
	r := row{lib: fairName, hotOnly: true}
	for i, n := range []int{8, 32} {
		admin.FlushAll(context.Background())
		r.hot[i] = hotKey(fairName, srv.addr, admin, n, d)
	}
	rows = append(rows, r)
	for _, name := range pipelinedNames {
		r := measuredRow(name)
		r.pipelined = true
		rows = append(rows, r)
	}
	var sems []semResult
	for _, name := range semaphoreNames {
		admin.FlushAll(context.Background())
		sems = append(sems, semaphoreRun(name, srv.addr, d))
	}
	if err := writeResults(rows, sems, d, heldFor, rtt); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
}

type latency struct {
	perSec   float64
	p50, p99 time.Duration
	release  time.Duration // the p50 of a release call (hot key)
	cmdsPer  float64       // Redis commands per operation
	switches float64       // holder changes per second
	minShare float64       // the least acquisitions of a contender, over the most
}

type heldResult struct {
	cpu        time.Duration // client CPU over the run
	rssPerLock float64       // bytes
	goroutines int
	cmdsPerSec float64
	serverCPU  time.Duration // redis-server's CPU over the run
	err        string
}

type row struct {
	lib         string
	uncontended [2]latency // 1 and 32 goroutines
	hot         [2]latency // 8 and 32 contenders
	ratio       [2]float64 // interleaved with raw go-redis pairs: 1 and 16 goroutines
	saturated   [3]float64 // 32 goroutines in phases: time per pair over raw, server CPU per pair over raw, its server µs per pair
	held        heldResult
	hotOnly     bool // measured on the hot key only
	pipelined   bool // through an AutoPipeliner: measured uncontended and saturated only
}

// uncontended runs g goroutines, each taking and releasing a key of its
// own for d, and returns the time of each pair.
func uncontended(lib library, g int, d time.Duration) []time.Duration {
	var mu sync.Mutex
	var times []time.Duration
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i := 0; i < g; i++ {
		l := lib.new(fmt.Sprintf("bench:u:%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			var mine []time.Duration
			for time.Now().Before(end) {
				t0 := time.Now()
				if ok, err := l.try(ctx); !ok || err != nil {
					fmt.Fprintln(os.Stderr, lib.name, "uncontended try:", ok, err)
					return
				}
				if err := l.release(ctx); err != nil {
					fmt.Fprintln(os.Stderr, lib.name, "release:", err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			times = append(times, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return times
}

// rawAcquire and rawRelease are the classic scripts, the baseline of
// interleaved and saturated.
var (
	rawAcquire = redis.NewScript(`return redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2])`)
	rawRelease = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)
)

// rawLock is raw go-redis EVALSHA of the classic scripts on keys[0], with
// a fixed owner.
type rawLock struct {
	c    redis.Scripter
	keys []string
}

func (r rawLock) try(ctx context.Context) (bool, error) {
	if err := r.c.EvalSha(ctx, rawAcquire.Hash(), r.keys, "fixed-owner-id-0123456789", lease.Milliseconds()).Err(); err != nil {
		return false, fmt.Errorf("raw acquire: %w", err)
	}
	return true, nil
}
func (rawLock) wait(context.Context) error { return errors.New("raw pairs do not wait") }
func (r rawLock) release(ctx context.Context) error {
	if err := r.c.EvalSha(ctx, rawRelease.Hash(), r.keys, "fixed-owner-id-0123456789").Err(); err != nil {
		return fmt.Errorf("raw release: %w", err)
	}
	return nil
}

// rawPair makes an acquire+release pair with raw go-redis EVALSHA of the
// classic scripts on keys[0].
func rawPair(ctx context.Context, c redis.Scripter, keys []string) error {
	l := rawLock{c: c, keys: keys}
	if _, err := l.try(ctx); err != nil {
		return err
	}
	return l.release(ctx)
}

// interleaved runs g goroutines for d, each making in turn an acquire and
// release pair with raw go-redis EVALSHA and one with lib (a new lock per
// pair, as go-zero code does), each on a key of its own, and returns the
// time spent in each: drift over the run hits both alike.
func interleaved(lib library, addr string, g int, d time.Duration) (raw, its time.Duration) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer c.Close()
	ctx := context.Background()
	for _, s := range []*redis.Script{rawAcquire, rawRelease} {
		s.Load(ctx, c)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rawKeys, key := []string{fmt.Sprintf("bench:raw:%d", i)}, fmt.Sprintf("bench:i:%d", i)
			var r, o time.Duration
			for time.Now().Before(end) {
				t0 := time.Now()
				if err := rawPair(ctx, c, rawKeys); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return
				}
				t1 := time.Now()
				l := lib.new(key)
				if ok, err := l.try(ctx); !ok || err != nil {
					fmt.Fprintln(os.Stderr, lib.name, "interleaved try:", ok, err)
					return
				}
				if err := l.release(ctx); err != nil {
					fmt.Fprintln(os.Stderr, lib.name, "release:", err)
					return
				}
				r, o = r+t1.Sub(t0), o+time.Since(t1)
			}
			mu.Lock()
			raw, its = raw+r, its+o
			mu.Unlock()
		}()
	}
	wg.Wait()
	return raw, its
}

// saturated runs 32 goroutines, each with a lock of its own of base (raw
// go-redis EVALSHA pairs) and one of lib, for d in 4 pairs of phases: all
// base's pairs, then all the library's. It returns the time per pair of
// each (base's, the library's) and redis-server's CPU per pair of each, in
// µs.
func saturated(base, lib library, admin *redis.Client, d time.Duration) [4]float64 {
	const workers, phases = 32, 4
	ctx := context.Background()
	locks := func(l library, prefix string) []lock {
		ls := make([]lock, workers)
		for i := range ls {
			ls[i] = l.new(fmt.Sprintf("%s%d", prefix, i))
		}
		return ls
	}
	baseLocks, itsLocks := locks(base, "bench:sraw:"), locks(lib, "bench:s:")
	phase := func(lib library, locks []lock) (pairs int64, took, cpu time.Duration) {
		cpu0, t0 := serverCPU(admin), time.Now()
		end := t0.Add(d / (2 * phases))
		var n atomic.Int64
		var wg sync.WaitGroup
		for _, l := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(end) {
					if ok, err := l.try(ctx); !ok || err != nil {
						fmt.Fprintln(os.Stderr, lib.name, "saturated try:", ok, err)
						return
					}
					if err := l.release(ctx); err != nil {
						fmt.Fprintln(os.Stderr, lib.name, "release:", err)
						return
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		return n.Load(), time.Since(t0), serverCPU(admin) - cpu0
	}
	var rawPairs, itsPairs int64
	var rawT, itsT, rawCPU, itsCPU time.Duration
	for range phases {
		p, t, cpu := phase(base, baseLocks)
		rawPairs, rawT, rawCPU = rawPairs+p, rawT+t, rawCPU+cpu
		p, t, cpu = phase(lib, itsLocks)
		itsPairs, itsT, itsCPU = itsPairs+p, itsT+t, itsCPU+cpu
	}
	per := func(d time.Duration, n int64) float64 { return float64(d.Microseconds()) / float64(max(n, 1)) }
	return [4]float64{per(rawT, rawPairs), per(itsT, itsPairs), per(rawCPU, rawPairs), per(itsCPU, itsPairs)}
}

// hotKey runs n contenders on one key for d, spread over hotProcesses
// child processes, each waiting the library's own way and holding the lock
// for 1ms, and measures the handoff from one holder's release call to the
// next different holder's acquisition, on the merged timeline of every
// process (they share the machine's clock).
func hotKey(lib, addr string, admin *redis.Client, n int, d time.Duration) latency {
	type event struct {
		g                 int
		got, rel, relDone int64
	}
	var (
		mu     sync.Mutex
		events []event
		wg     sync.WaitGroup
	)
	start := time.Now().Add(time.Second) // a second to start the processes
	end := start.Add(d)
	cmds0 := totalCommands(admin)
	for p := 0; p < hotProcesses; p++ {
		per := n / hotProcesses
		cmd := exec.Command(os.Args[0], "-hot", lib, "-addr", addr, "-first", strconv.Itoa(1+p*per),
			"-contenders", strconv.Itoa(per), "-from", strconv.FormatInt(start.UnixNano(), 10),
			"-until", strconv.FormatInt(end.UnixNano(), 10))
		cmd.Stderr = os.Stderr
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "hot key:", err)
			return latency{}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cmd.Wait()
			sc := bufio.NewScanner(out)
			var mine []event
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) == 5 && f[0] == "acq" {
					var e event
					e.g, _ = strconv.Atoi(f[1])
					e.got, _ = strconv.ParseInt(f[2], 10, 64)
					e.rel, _ = strconv.ParseInt(f[3], 10, 64)
					e.relDone, _ = strconv.ParseInt(f[4], 10, 64)
					mine = append(mine, e)
				}
			}
			mu.Lock()
			events = append(events, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	cmds := totalCommands(admin) - cmds0
	slices.SortFunc(events, func(a, b event) int { return int(a.got - b.got) })
	var handoffs, releases []time.Duration
	perContender := make([]int64, n+1)
	for i, e := range events {
		perContender[e.g]++
		releases = append(releases, time.Duration(e.relDone-e.rel))
		if i > 0 && events[i-1].g != e.g {
			handoffs = append(handoffs, time.Duration(e.got-events[i-1].rel))
		}
	}
	acquired := int64(len(events))
	least, most := acquired, int64(0)
	for _, c := range perContender[1:] {
		least, most = min(least, c), max(most, c)
	}
	return latency{
		switches: float64(len(handoffs)) / d.Seconds(),
		minShare: float64(least) / float64(max(most, 1)),
		perSec:   float64(acquired) / d.Seconds(),
		p50:      pct(handoffs, 50),
		p99:      pct(handoffs, 99),
		release:  pct(releases, 50),
		cmdsPer:  float64(cmds) / float64(max(acquired, 1)),
	}
}

// hotChild runs count contenders of the hot key, numbered from first,
// until stop, and prints each acquisition: "acq <contender> <acquired>
// <release called> <release returned>", in ns since the epoch. The contenders of every
// process start together, at start.
func hotChild(name, addr string, first, count int, start, stop time.Time) {
	lib := newLibrary(name, addr)
	defer lib.close()
	ctx, cancel := context.WithDeadline(context.Background(), stop)
	defer cancel()
	time.Sleep(time.Until(start))
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var wg sync.WaitGroup
	for g := first; g < first+count; g++ {
		l := lib.new("bench:hot")
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lines []string
			for ctx.Err() == nil {
				// The wait must not end the hold with ctx (redislock and
				// rueidislock bind the hold to it): a context of its own.
				wctx, wcancel := context.WithCancel(context.Background())
				stopWait := context.AfterFunc(ctx, wcancel)
				err := l.wait(wctx)
				stopWait()
				if err != nil {
					wcancel()
					break
				}
				got := time.Now()
				for end := got.Add(time.Millisecond); time.Now().Before(end); {
					runtime.Gosched()
				}
				rel := time.Now()
				_ = l.release(context.Background())
				relDone := time.Now()
				wcancel()
				if got.Before(stop) {
					lines = append(lines, fmt.Sprintf("acq %d %d %d %d", g, got.UnixNano(), rel.UnixNano(), relDone.UnixNano()))
				}
			}
			mu.Lock()
			for _, line := range lines {
				fmt.Fprintln(out, line)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
}

// heldRun runs the held-locks scenario in a child process, for clean CPU
// and memory figures, and counts the Redis commands meanwhile.
func heldRun(lib, addr string, admin *redis.Client, d time.Duration) heldResult {
	cmd := exec.Command(os.Args[0], "-held", lib, "-addr", addr, "-quick="+strconv.FormatBool(*quick))
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		return heldResult{err: err.Error()}
	}
	defer cmd.Wait()
	sc := bufio.NewScanner(out)
	var r heldResult
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch f[0] {
		case "holding": // all locks held: measure Redis from now on
			c0, s0 := totalCommands(admin), serverCPU(admin)
			time.Sleep(d)
			r.cmdsPerSec = float64(totalCommands(admin)-c0) / d.Seconds()
			r.serverCPU = serverCPU(admin) - s0
			_ = in.Close() // the child stops holding
		case "result":
			cpu, _ := time.ParseDuration(f[1])
			r.cpu = cpu
			r.rssPerLock, _ = strconv.ParseFloat(f[2], 64)
			r.goroutines, _ = strconv.Atoi(f[3])
		case "error":
			r.err = strings.Join(f[1:], " ")
		}
	}
	return r
}

// serverCPU is redis-server's CPU time so far (user and system), from
// INFO cpu.
func serverCPU(c *redis.Client) time.Duration {
	var total float64
	for _, line := range strings.Split(c.Info(context.Background(), "cpu").Val(), "\r\n") {
		for _, field := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, field); ok {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}

func totalCommands(c *redis.Client) int64 {
	info := c.Info(context.Background(), "stats").Val()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// roundTrip is the p50 of 2,000 PINGs of one client, one after another:
// the loopback's round trip, as the handoffs are measured against it.
func roundTrip(c *redis.Client) time.Duration {
	times := make([]time.Duration, 2000)
	for i := range times {
		t0 := time.Now()
		c.Ping(context.Background())
		times[i] = time.Since(t0)
	}
	return pct(times, 50)
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, len(ds)*p/100)]
}

type redisProc struct {
	*exec.Cmd
	addr string
}

func startRedis() (*redisProc, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "redislock-bench")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--maxclients", "20000")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redis-server: %w (install it: apt-get install redis-server)", err)
	}
	p := &redisProc{Cmd: cmd, addr: "127.0.0.1:" + strconv.Itoa(port)}
	c := redis.NewClient(&redis.Options{Addr: p.addr})
	defer c.Close()
	for i := 0; i < 200; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return p, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	cmd.Process.Kill()
	return nil, fmt.Errorf("redis-server on %s did not answer", p.addr)
}
