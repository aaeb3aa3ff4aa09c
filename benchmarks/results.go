package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// writeResults writes results.md (the tables) and chart.svg.
func writeResults(rows []row, sems []semResult, d, heldFor, rtt time.Duration) error {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "# Side-by-side: redislock and other Go Redis locks\n\n")
	fmt.Fprintf(&b, "Run with `cd benchmarks && go run .` on %s (%s/%s, %d CPUs, %s), one redis-server on loopback, %s.\n",
		host, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintf(&b, "Lease %v everywhere. Each scenario runs %v; held locks are held %v.\n\n", lease, d, heldFor)

	fmt.Fprintf(&b, "## Uncontended acquire+release (one key per goroutine)\n\n")
	fmt.Fprintf(&b, "Interleaved: 6 rounds of %v per library in turn, so that the loopback's drift over the run hits every library alike.\n\n", d/6)
	fmt.Fprintf(&b, "| library | 1 goroutine: pairs/s | p50 | p99 | 32 goroutines: pairs/s | p50 | p99 |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.hotOnly {
			continue
		}
		u := r.uncontended
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %.0f | %s | %s |\n", r.lib, u[0].perSec, us(u[0].p50), us(u[0].p99), u[1].perSec, us(u[1].p50), us(u[1].p99))
	}
	fmt.Fprintf(&b, "\n*%s*: redislock on FromGoRedis(ap), ap the AutoPipeliner of its go-redis client (c.AutoPipeline()), which batches concurrent calls into pipelines. *%s*: the raw go-redis pair of the next section through one.\n", pipelinedName, rawPipelinedName)
	fmt.Fprintf(&b, "\n## Against raw go-redis, interleaved\n\n")
	fmt.Fprintf(&b, "Each goroutine makes, in turn, an acquire+release pair with raw go-redis EVALSHA of the classic scripts (SET NX PX; an owner-checked DEL) and one with the library, a new lock per pair as go-zero code does, each on a key of its own; the ratio is the library's time over the raw pairs' time, summed over 6 rounds of %v per library. 1.00 costs nothing over the Redis client.\n\n", d/6)
	fmt.Fprintf(&b, "| library | 1 goroutine: ratio to raw | 16 goroutines: ratio to raw |\n|---|---|---|\n")
	for _, r := range rows {
		if !r.hotOnly && !r.pipelined {
			fmt.Fprintf(&b, "| %s | %.3f | %.3f |\n", r.lib, r.ratio[0], r.ratio[1])
		}
	}
	fmt.Fprintf(&b, "\n## Saturated: 32 goroutines, phases of raw go-redis pairs and the library's\n\n")
	fmt.Fprintf(&b, "32 goroutines, each with a lock (and a raw key) of its own, make acquire+release pairs for %v in 4 pairs of phases: all raw go-redis EVALSHA pairs (as above), then all the library's; 6 rounds per library in turn. Time per pair and redis-server's CPU per pair (INFO cpu) of the library over raw's; 2 cores run the clients and the server, so the client's CPU shows in its time.\n\n", d/6)
	fmt.Fprintf(&b, "| library | time per pair / raw | server CPU per pair / raw | server CPU per pair |\n|---|---|---|---|\n")
	for _, r := range rows {
		if !r.hotOnly {
			fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.1f µs |\n", r.lib, r.saturated[0], r.saturated[1], r.saturated[2])
		}
	}
	fmt.Fprintf(&b, "\nThe ratios of *%s* are to raw pairs through an AutoPipeliner (as *%s* makes them); those of every other row, *%s* included, to plain raw pairs.\n", pipelinedName, rawPipelinedName, rawPipelinedName)
	fmt.Fprintf(&b, "\n## One hot key, 1 ms holds, contenders spread over %d processes, each library's own waiting\n\n", hotProcesses)
	fmt.Fprintf(&b, "go-zero has no waiting: a 1 ms retry loop. bsm/redislock: ExponentialBackoff(2ms, 100ms). redsync: its default retry delay (50-250 ms at random). rueidislock: client-side caching invalidations. redislock: AcquireWait (pub/sub wake-ups; waiters of one process take turns, processes race). redislock, fair: AcquireWait with WithFairness (a queue in Redis; the release hands the lock over). Each process has one client per library; the contenders of a process are goroutines with a lock each. Handoff: from one holder's release call to the next different holder's acquisition, on the timeline of all processes merged. Commands: all Redis commands (total_commands_processed, commands inside scripts included) per acquisition.\n\n")
	fmt.Fprintf(&b, "A round trip (PING, one client, idle) took %s at p50 in this run. The release call (from the call to its return, in the holder's process, under the same load) is the round trip a handoff of redislock's fair locks is made of: the next holder hears the release's message as the releaser hears its reply.\n\n", us(rtt))
	fmt.Fprintf(&b, "Holder changes/s counts acquisitions by a different contender than the last; fairness is the fewest acquisitions of a contender over the most (1 = equal turns, 0 = someone starved).\n\n")
	for i, n := range []int{8, 32} {
		fmt.Fprintf(&b, "%d contenders:\n\n| library | acq/s | holder changes/s | handoff p50 | p99 | release call p50 | commands/acq | fairness |\n|---|---|---|---|---|---|---|---|\n", n)
		for _, r := range rows {
			if r.pipelined {
				continue
			}
			h := r.hot[i]
			fmt.Fprintf(&b, "| %s | %.0f | %.0f | %s | %s | %s | %.1f | %.2f |\n", r.lib, h.perSec, h.switches, us(h.p50), us(h.p99), us(h.release), h.cmdsPer, h.minShare)
		}
		fmt.Fprintln(&b)
	}
	fmt.Fprintf(&b, "\n## %d locks held for %v with renewal at lease/3\n\n", heldLocks, heldFor)
	fmt.Fprintf(&b, "redislock and rueidislock renew by themselves; for go-zero (re-acquire), bsm/redislock (Refresh) and redsync (Extend), a goroutine per lock renews every lease/3, as their documentation leaves it to users. Each library runs in a process of its own.\n\n")
	fmt.Fprintf(&b, "redis-server CPU per renewal assumes one renewal per lock per lease/3 (%v).\n\n", lease/3)
	fmt.Fprintf(&b, "| library | client CPU | CPU per lock per second | redis-server CPU per renewal | RSS per held lock | goroutines | Redis commands/s |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		h := r.held
		if r.hotOnly || r.pipelined {
			continue
		}
		if h.err != "" {
			fmt.Fprintf(&b, "| %s | error: %s | | | | | |\n", r.lib, h.err)
			continue
		}
		renewals := float64(heldLocks) * heldFor.Seconds() / (lease / 3).Seconds()
		fmt.Fprintf(&b, "| %s | %v | %.1f µs | %.1f µs | %.0f B | %d | %.0f |\n", r.lib, h.cpu.Round(time.Millisecond),
			float64(h.cpu.Microseconds())/heldLocks/heldFor.Seconds(), float64(h.serverCPU.Microseconds())/renewals,
			h.rssPerLock, max(0, h.goroutines), h.cmdsPerSec)
	}
	fmt.Fprintf(&b, "\n## A semaphore: %d workers, %d permits, %v sections\n\n", semWorkers, permits, semSection)
	fmt.Fprintf(&b, "Each worker takes a permit, works %v, releases it, again for %v. No other Go library has a semaphore: users take one of %d locks on %d keys, trying each in turn and sleeping 1 ms when all are taken (\"3 keys\"). redislock's WithPermits waits with AcquireWait (a release wakes a waiter). Fairness: the fewest sections of a worker over the most.\n\n", semSection, d, permits, permits)
	fmt.Fprintf(&b, "| contender | sections/s | most at once | fairness |\n|---|---|---|---|\n")
	for _, r := range sems {
		fmt.Fprintf(&b, "| %s | %.0f | %d | %.2f |\n", r.name, r.perSec, r.most, r.minShare)
	}
	if err := os.WriteFile("results.md", []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile("chart.svg", []byte(chart(rows, sems, heldFor)), 0o644)
}

func us(d time.Duration) string {
	if d >= 10*time.Millisecond {
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

// chart draws ten bar charts, two by five, each where a user would
// choose: client CPU per held lock per second while renewing; uncontended
// pairs per second with 1 and 32 goroutines; on the hot key over 4
// processes, acquisitions per second for 8 and 32 contenders, and for 32
// fairness, Redis commands per acquisition and the handoff's p99; the
// semaphore's sections per second; and redis-server's CPU per pair,
// saturated. It shows where we are behind as well as where we lead.
func chart(rows []row, sems []semResult, heldFor time.Duration) string {
	const w, panelH, pad, barH = 860, 60 + 36*7, 190, 24
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="13">`+"\n", w, 5*panelH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	panel := func(x0, y0 int, title string, value func(r row) float64, format string, in func(r row) bool) {
		var shown []row
		for _, r := range rows {
			if in(r) {
				shown = append(shown, r)
			}
		}
		maxV := 0.0
		for _, r := range shown {
			maxV = max(maxV, value(r))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, y0+24, title)
		for i, r := range shown {
			y := y0 + 44 + i*36
			v := value(r)
			bw := 0.0
			if maxV > 0 {
				bw = v / maxV * float64(w/2-pad-60)
			}
			color := "#8a9bb0"
			if strings.HasPrefix(r.lib, "redislock") {
				color = "#d2452c"
			}
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x0+pad-8, y+17, r.lib)
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0+pad, y, bw, barH, color)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">`+format+`</text>`+"\n", float64(x0+pad)+bw+6, y+17, v)
		}
	}
	// Which rows a panel shows: the uncontended and saturated runs have no
	// fair row, the hot key no pipelined rows, held locks neither.
	measured := func(r row) bool { return !r.hotOnly }
	hot := func(r row) bool { return !r.pipelined }
	held := func(r row) bool { return !r.hotOnly && !r.pipelined }
	// Where a user would choose: held locks, uncontended pairs, then the
	// hot key; ours beside every peer, whoever leads.
	panel(10, 0, "10,000 held locks: client µs per lock per s ↓", func(r row) float64 {
		return float64(r.held.cpu.Microseconds()) / heldLocks / heldFor.Seconds()
	}, "%.1f", held)
	panel(w/2+10, 0, "uncontended pairs/s, 1 goroutine ↑", func(r row) float64 { return r.uncontended[0].perSec }, "%.0f", measured)
	panel(10, panelH, "uncontended pairs/s, 32 goroutines ↑", func(r row) float64 { return r.uncontended[1].perSec }, "%.0f", measured)
	panel(w/2+10, panelH, "8 contenders, 4 processes: acquisitions/s ↑", func(r row) float64 { return r.hot[0].perSec }, "%.0f", hot)
	panel(10, 2*panelH, "32 contenders, 4 processes: acquisitions/s ↑", func(r row) float64 { return r.hot[1].perSec }, "%.0f", hot)
	panel(w/2+10, 2*panelH, "32 contenders: fairness (1 = equal turns) ↑", func(r row) float64 { return r.hot[1].minShare }, "%.2f", hot)
	panel(10, 3*panelH, "32 contenders: Redis commands per acquisition ↓", func(r row) float64 { return r.hot[1].cmdsPer }, "%.1f", hot)
	panel(w/2+10, 3*panelH, "32 contenders: handoff p99 µs ↓", func(r row) float64 { return float64(r.hot[1].p99.Microseconds()) }, "%.0f", hot)
	panel(w/2+10, 4*panelH, "saturated, 32 goroutines: redis-server µs per pair ↓", func(r row) float64 { return r.saturated[2] }, "%.1f", measured)
	// The semaphore, as the rows of one more panel.
	var semRows []row
	for _, s := range sems {
		semRows = append(semRows, row{lib: s.name, hot: [2]latency{{perSec: s.perSec}}})
	}
	rows = semRows
	panel(10, 4*panelH, fmt.Sprintf("semaphore: %d workers, %d permits: sections/s ↑", semWorkers, permits), func(r row) float64 { return r.hot[0].perSec }, "%.0f", hot)
	b.WriteString("</svg>\n")
	return b.String()
}
