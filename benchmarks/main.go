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
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
)

var (
	quick = flag.Bool("quick", false, "shorter runs, for a smoke test")
	held  = flag.String("held", "", "internal: run the held-locks scenario for this library against -addr")
	addr  = flag.String("addr", "", "internal: the Redis address for -held")
)

const heldLocks = 10_000

func main() {
	flag.Parse()
	logx.Disable() // go-zero's slow-call logs would drown the run
	if *held != "" {
		heldChild(*held, *addr)
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
	// Uncontended pairs are interleaved: rounds of d/rounds per library in
	// turn, so that the loopback's drift over the run (10-20%, and more on
	// a noisy day) hits every library alike.
	const rounds = 6
	pairs := map[string]*[2][]time.Duration{}
	for round := 0; round < rounds; round++ {
		for _, name := range libraryNames {
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
	var rows []row
	for _, name := range libraryNames {
		lib := newLibrary(name, srv.addr)
		r := row{lib: lib.name}
		for i := range r.uncontended {
			times := pairs[name][i]
			r.uncontended[i] = latency{perSec: float64(len(times)) / d.Seconds(), p50: pct(times, 50), p99: pct(times, 99)}
		}
		for i, n := range []int{8, 32} {
			admin.FlushAll(context.Background())
			r.hot[i] = hotKey(lib, admin, n, d)
		}
		lib.close()
		admin.FlushAll(context.Background())
		r.held = heldRun(lib.name, srv.addr, admin, heldFor)
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "%s done\n", lib.name)
	}
	if err := writeResults(rows, d, heldFor); err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
}

type latency struct {
	perSec   float64
	p50, p99 time.Duration
	cmdsPer  float64 // Redis commands per operation
	switches float64 // holder changes per second
	minShare float64 // the least acquisitions of a contender, over the most
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
	held        heldResult
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

// hotKey runs n contenders on one key for d, each waiting the library's
// own way and holding the lock for 1ms, and measures the handoff from one
// holder's release call to the next different holder's acquisition.
func hotKey(lib library, admin *redis.Client, n int, d time.Duration) latency {
	var (
		mu                      sync.Mutex
		handoffs                []time.Duration
		acquired                atomic.Int64
		lastHolder, lastRelease atomic.Int64
		wg                      sync.WaitGroup
		perContender            = make([]int64, n+1)
	)
	cmds0 := totalCommands(admin)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for g := 1; g <= n; g++ {
		l := lib.new("bench:hot")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				// The wait must not end the hold with ctx (redislock and
				// rueidislock bind the hold to it): a context of its own.
				wctx, wcancel := context.WithCancel(context.Background())
				stop := context.AfterFunc(ctx, wcancel)
				err := l.wait(wctx)
				stop()
				if err != nil {
					wcancel()
					return
				}
				got := time.Now()
				if prev := lastHolder.Load(); prev != 0 && prev != int64(g) {
					mu.Lock()
					handoffs = append(handoffs, got.Sub(time.Unix(0, lastRelease.Load())))
					mu.Unlock()
				}
				acquired.Add(1)
				perContender[g]++
				for end := got.Add(time.Millisecond); time.Now().Before(end); {
					runtime.Gosched()
				}
				lastHolder.Store(int64(g))
				lastRelease.Store(time.Now().UnixNano())
				_ = l.release(context.Background())
				wcancel()
			}
		}()
	}
	wg.Wait()
	n64 := acquired.Load()
	least, most := n64, int64(0)
	for _, c := range perContender[1:] {
		least, most = min(least, c), max(most, c)
	}
	return latency{
		switches: float64(len(handoffs)) / d.Seconds(),
		minShare: float64(least) / float64(max(most, 1)),
		perSec:   float64(n64) / d.Seconds(),
		p50:      pct(handoffs, 50),
		p99:      pct(handoffs, 99),
		cmdsPer:  float64(totalCommands(admin)-cmds0) / float64(max(n64, 1)),
	}
}

// heldRun runs the held-locks scenario in a child process, for clean CPU
// and memory figures, and counts the Redis commands meanwhile.
func heldRun(lib, addr string, admin *redis.Client, d time.Duration) heldResult {
	cmd := exec.Command(os.Args[0], "-held", lib, "-addr", addr, "-quick="+strconv.FormatBool(*quick))
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
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
			_ = cmd.Process.Signal(syscall.SIGUSR1)
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
