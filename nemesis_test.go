package redislock

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock/internal/redisserver"
)

// The nemesis: every primitive at once, in several child processes, on a
// Sentinel set (a primary, its replica, a Sentinel; each server with
// appendonly and fsync always, on tmpfs), while faults are injected at
// random and overlapping. Each section of each worker is recorded: its
// take (the call and return of its acquisition), its give (from the end
// of its holder's belief, that is its release, or its lease's end by its
// own accounting if it learnt of a loss, to the release's return, or to a
// lease later for a release unanswered or a process killed), and for
// fenced locks, its fenced read-modify-write of a counter in a server of
// its own. A process is killed at any moment: before each release and
// each fenced write it records that it begins them, so that a release
// that ran ends the belief there, and a write that may have run counts
// as one that may have. porcupine then checks each key's history: a lock
// (plain, fenced, fair) and an election's terms against a semaphore of
// one, a semaphore against one of its permits, a shared lock against
// readers-writers, and the fenced writes (under terms too) against a
// fenced register. With WithReplicas(1) no violation is promised; without
// it, failovers to a lagging replica give the lock to a second holder, and
// the run measures how often.

// nemesisPrimitive is a key the workers share, of one kind of lock.
type nemesisPrimitive struct {
	name, key string
	opts      []Option
	n         int  // holdersModel's: 1 a lock, n permits, 0 a shared lock
	fenced    bool // sections write the counter with their tokens
	workers   int  // per process
	writers   int  // of a shared lock: exclusive workers per process, after its shares
	election  bool // candidates: Campaign and Resign, a term a section
}

// nemesisHolder is what a worker holds: a lock, or an Election's terms.
type nemesisHolder struct {
	rl      *RedisLock // its holds (Until, Done, Token, Owner)
	acquire func(context.Context) error
	release func(context.Context) (bool, error)
}

// nemesisHolderOf returns the worker client's holder of p, from locker.
func nemesisHolderOf(locker *Locker, p nemesisPrimitive, opts []Option, client int) nemesisHolder {
	if p.election {
		e := locker.NewElection(p.key, opts...)
		return nemesisHolder{rl: e.rl, acquire: func(ctx context.Context) error { return e.Campaign(ctx, strconv.Itoa(client)) },
			release: func(ctx context.Context) (bool, error) { err := e.Resign(ctx); return err == nil, err }}
	}
	rl := locker.NewLock(p.key, opts...)
	return nemesisHolder{rl: rl, acquire: rl.AcquireWait, release: rl.ReleaseCtx}
}

var nemesisPrimitives = []nemesisPrimitive{
	{name: "plain", key: "nemesis:plain", n: 1, workers: 1},
	{name: "fenced", key: "nemesis:fenced", opts: []Option{WithFencing()}, n: 1, fenced: true, workers: 1},
	{name: "fair", key: "nemesis:fair", opts: []Option{WithFairness(), WithFencing()}, n: 1, fenced: true, workers: 1},
	{name: "permits", key: "nemesis:permits", opts: []Option{WithPermits(2)}, n: 2, workers: 2},
	{name: "shared", key: "nemesis:shared", opts: []Option{WithShared()}, n: 0, workers: 2, writers: 1},
	{name: "election", key: "nemesis:election", n: 1, fenced: true, workers: 1, election: true},
}

// nemesisLease is every lock's lease in the nemesis.
const nemesisLease = time.Second

// nemesisChild runs the workers of every primitive in a child process, on
// a failover client of the set NEMESIS_SENTINEL watches (dialing each
// announced address's counterpart in NEMESIS_DIAL), until its stdin
// closes; it appends each section's operations to NEMESIS_HISTORY, one
// line each, in a single write.
func nemesisChild(out io.Writer) error {
	dial := map[string]string{}
	for _, pair := range strings.Split(os.Getenv("NEMESIS_DIAL"), ",") {
		if from, to, ok := strings.Cut(pair, "="); ok {
			dial[from] = to
		}
	}
	replicas, _ := strconv.Atoi(os.Getenv("NEMESIS_REPLICAS"))
	base, _ := strconv.Atoi(os.Getenv("NEMESIS_BASE"))
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: []string{os.Getenv("NEMESIS_SENTINEL")},
		MaxRetries: 3, PoolSize: 32, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if to, ok := dial[addr]; ok {
				addr = to
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	defer c.Close()
	// The resource's writes are not retried: a write whose reply timed out
	// (its process stopped past the deadline) may have run, and a retry
	// would run it again. Its outcome is then unknown, as it is.
	resource := redis.NewClient(&redis.Options{Addr: os.Getenv("NEMESIS_RESOURCE"), MaxRetries: -1, ReadTimeout: 10 * time.Second})
	defer resource.Close()
	history, err := os.OpenFile(os.Getenv("NEMESIS_HISTORY"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer history.Close()
	record := func(format string, args ...any) { _, _ = history.WriteString(fmt.Sprintf(format, args...)) }
	if os.Getenv("REDISLOCK_NEMESIS_KEEP") != "" {
		trace, err := os.OpenFile(os.Getenv("NEMESIS_HISTORY")+".trace", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer trace.Close()
		c.AddHook(traceHook{trace})
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop() }()
	locker := NewLocker(FromGoRedis(c), WithExpiry(nemesisLease), WithReplicas(replicas), WithWaitTimeout(2*time.Second))
	var wg sync.WaitGroup
	var sections atomic.Int64
	client := base
	for pi, p := range nemesisPrimitives {
		for w := 0; w < p.workers+p.writers; w++ {
			shared, opts := p.n != 1, p.opts
			if w >= p.workers { // a shared lock's writer
				shared, opts = false, nil
			}
			id := client
			client++
			holder := nemesisHolderOf(locker, p, opts, id)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if nemesisSection(ctx, holder, pi, id, shared, resource, record) {
						sections.Add(1)
					}
				}
			}()
		}
	}
	fmt.Fprintln(out, "started")
	wg.Wait()
	if err := locker.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "nemesis child: Close:", err)
	}
	fmt.Fprintln(out, "done", sections.Load())
	return nil
}

// traceHook writes each command (of a pipeline too) that names a key of
// the nemesis's locks, with its start, its end and its reply, to a file.
type traceHook struct{ out *os.File }

func (traceHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h traceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now().UnixNano()
		err := next(ctx, cmd)
		h.write(start, []redis.Cmder{cmd})
		return err
	}
}

func (h traceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now().UnixNano()
		err := next(ctx, cmds)
		h.write(start, cmds)
		return err
	}
}

func (h traceHook) write(start int64, cmds []redis.Cmder) {
	end := time.Now().UnixNano()
	var b strings.Builder
	for _, cmd := range cmds {
		args := cmd.Args()
		if line := fmt.Sprint(args...); !strings.Contains(line, "nemesis:fenced") && !strings.Contains(line, "nemesis:fair") && !strings.Contains(line, "nemesis:election") &&
			(cmd.Name() != "wait" || b.Len() == 0) {
			continue
		}
		if len(args) > 3 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") { // the script's hash or text
			args = append([]any{args[0], "-"}, args[2:]...)
		}
		reply := fmt.Sprint(cmd.Err())
		if c, ok := cmd.(*redis.Cmd); ok && cmd.Err() == nil {
			reply = fmt.Sprint(c.Val())
		}
		fmt.Fprintf(&b, "%d %d %v => %s\n", start, end, args, strings.ReplaceAll(reply, "\n", " | "))
	}
	_, _ = h.out.WriteString(b.String())
}

// nemesisSection is one section of a worker, recorded as "H" lines (take,
// give) and, fenced, an "F" line (see nemesisOp). It reports whether the
// worker held the lock.
func nemesisSection(ctx context.Context, holder nemesisHolder, prim, client int, shared bool, resource *redis.Client,
	record func(string, ...any)) bool {
	rl := holder.rl
	call := time.Now().UnixNano()
	if err := holder.acquire(ctx); err != nil {
		if ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond) // refused, not replicated: again
		}
		return false
	}
	took := time.Now()
	record("H %d %d %t true %d %d true %s\n", prim, client, shared, call, took.UnixNano(), cmp.Or(rl.Owner(), "-")) // "": lost already
	until := rl.Until()
	if until.Before(took) { // it lost the hold as it took it (its process stopped past the lease): Until is zero, or past
		until = took
	}
	record("U %d %d %d\n", prim, client, until.UnixNano()) // its belief's end, should its process be killed
	if nemesisPrimitives[prim].fenced {
		// Its call is taken before its belief is checked: a write made
		// after a pause has an early call, not a late one.
		key := nemesisPrimitives[prim].key + ":resource"
		op := fencedOp{Key: key, Client: client, Token: rl.Token(), Call: time.Now().UnixNano()}
		if believes(rl) {
			if n, err := nemesisRead.Run(context.Background(), resource, []string{key}, op.Token).Int64(); err == nil {
				// W before the write, F after: a write whose process was
				// killed between them may have run.
				record("W %d %d %d %d %d\n", prim, client, op.Token, n, op.Call)
				outcome := "unknown"
				if ok, err := nemesisWrite.Run(context.Background(), resource, []string{key}, op.Token, n+1).Int(); err == nil {
					outcome = map[bool]string{true: "accepted", false: "refused"}[ok == 1]
				}
				if outcome == "refused" && believes(rl) {
					outcome = "refused-held" // refused although its holder still believed
				}
				record("F %d %d %d %d %s %d %d\n", prim, client, op.Token, n, outcome, op.Call, time.Now().UnixNano())
			}
		}
	}
	hold := time.Duration(rand.IntN(3000)) * time.Microsecond
	if rand.IntN(16) == 0 { // a long section: renewed, across faults
		hold = time.Duration(300+rand.IntN(1200)) * time.Millisecond
	}
	// It believes until it learns of a loss (Done), or until its lease
	// ends by its own accounting (Until, sampled every 20 ms: a process
	// stopped past its lease learns only when it runs again).
	var end time.Time
	tick := time.NewTicker(20 * time.Millisecond)
	for done := time.After(hold); end.IsZero(); {
		select {
		case <-done:
			end = time.Now()
		case <-rl.Done():
			end = time.Now()
		case <-tick.C:
		}
		if u := rl.Until(); !u.IsZero() && !u.Equal(until) {
			until = u
			record("U %d %d %d\n", prim, client, until.UnixNano())
		}
	}
	tick.Stop()
	if until.Before(end) {
		end = until
	}
	record("G %d %d %d\n", prim, client, end.UnixNano()) // its belief's end, should its process be killed releasing
	ok, err := holder.release(context.Background())
	ret := time.Now()
	if !ok || err != nil { // unanswered, or lost: the key lasts a lease at most
		ret = end.Add(nemesisLease)
	}
	record("H %d %d %t false %d %d %t\n", prim, client, shared, end.UnixNano(), ret.UnixNano(), ok && err == nil)
	return true
}

// nemesisOp is a line of a child's history: a holdOp of a primitive (and
// whether a give's release returned true), a fenced write, or the end of
// a client's lease by its own accounting (until: "U" lines).
type nemesisOp struct {
	prim     int
	hold     holdOp
	released bool
	owner    string // a take's
	fenced   *fencedOp
	intent   bool // fenced is a write about to be sent ("W")
	until    int64
	giving   int64 // the end of a belief, as a release is sent ("G")
}

func parseNemesisOps(path string) ([]nemesisOp, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []nemesisOp
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var op nemesisOp
		var kind string
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "H "):
			_, err = fmt.Sscan(line, &kind, &op.prim, &op.hold.Client, &op.hold.Shared, &op.hold.Take, &op.hold.Call, &op.hold.Return, &op.released)
			if err == nil && op.hold.Take {
				_, err = fmt.Sscan(line, &kind, &kind, &kind, &kind, &kind, &kind, &kind, &kind, &op.owner)
			}
		case strings.HasPrefix(line, "G "):
			_, err = fmt.Sscan(line, &kind, &op.prim, &op.hold.Client, &op.giving)
		case strings.HasPrefix(line, "U "):
			_, err = fmt.Sscan(line, &kind, &op.prim, &op.hold.Client, &op.until)
		case strings.HasPrefix(line, "W "):
			op.fenced, op.intent = &fencedOp{Unknown: true}, true
			_, err = fmt.Sscan(line, &kind, &op.prim, &op.fenced.Client, &op.fenced.Token, &op.fenced.Read, &op.fenced.Call)
		case strings.HasPrefix(line, "F "):
			op.fenced = &fencedOp{}
			var outcome string
			_, err = fmt.Sscan(line, &kind, &op.prim, &op.fenced.Client, &op.fenced.Token, &op.fenced.Read, &outcome, &op.fenced.Call, &op.fenced.Return)
			op.fenced.Accepted, op.fenced.Unknown = outcome == "accepted", outcome == "unknown"
			op.fenced.Held = outcome == "refused-held"
		default:
			err = errors.New("unknown")
		}
		if err != nil || op.prim < 0 || op.prim >= len(nemesisPrimitives) {
			continue // the last line of a process killed while it wrote
		}
		if op.fenced != nil {
			op.fenced.Key = nemesisPrimitives[op.prim].key
		}
		ops = append(ops, op)
	}
	return ops, sc.Err()
}

// nemesisRead returns the resource's counter (KEYS[1]) and records its
// reader's token (ARGV[1]): the resource sees the token on every access,
// as docs/fencing.md asks of a read-modify-write, so that a stale
// holder's write cannot land between a newer holder's read and write.
var nemesisRead = redis.NewScript(`
if tonumber(ARGV[1]) > tonumber(redis.call("HGET", KEYS[1], "seen") or "0") then
  redis.call("HSET", KEYS[1], "seen", ARGV[1])
end
return tonumber(redis.call("HGET", KEYS[1], "count") or "0")`)

// nemesisWrite writes the counter (KEYS[1]) with a token (ARGV[1]) no
// lower than any the resource has seen and higher than the last write's,
// and returns 1; or refuses, and returns 0.
var nemesisWrite = redis.NewScript(`
local seen = tonumber(redis.call("HGET", KEYS[1], "seen") or "0")
local last = tonumber(redis.call("HGET", KEYS[1], "token") or "0")
if tonumber(ARGV[1]) < seen or tonumber(ARGV[1]) <= last then return 0 end
redis.call("HSET", KEYS[1], "seen", ARGV[1], "token", ARGV[1], "count", ARGV[2])
return 1`)

// fencingViolation is a fenced write that breaks a promise: when it began,
// and how.
type fencingViolation struct {
	at   int64
	what string
}

// fencingViolations returns the fenced writes that break fencing's
// promises. Tokens increase in the order holders take the lock: a write
// that began after another returned has a higher token (its holder took
// the lock after the other's). The resource refuses only a holder a later
// one overtook: a write refused while its holder still believed it held
// is a violation. A process stopped between its read and its write is
// neither (its write's call is early, and its belief ended).
func fencingViolations(writes []fencedOp) []fencingViolation {
	byCall := slices.Clone(writes)
	slices.SortFunc(byCall, func(a, b fencedOp) int { return cmp.Compare(a.Call, b.Call) })
	byReturn := slices.Clone(writes)
	slices.SortFunc(byReturn, func(a, b fencedOp) int { return cmp.Compare(a.Return, b.Return) })
	var bad []fencingViolation
	var highest *fencedOp // of the writes returned before the call at hand
	j := 0
	for _, w := range byCall {
		for ; j < len(byReturn) && byReturn[j].Return < w.Call; j++ {
			if highest == nil || byReturn[j].Token > highest.Token {
				highest = &byReturn[j]
			}
		}
		if highest != nil && highest.Token >= w.Token {
			bad = append(bad, fencingViolation{w.Call, fmt.Sprintf("%s began after %s returned, with a token no higher", w, highest)})
		}
		if w.Held {
			bad = append(bad, fencingViolation{w.Call, fmt.Sprintf("%s was refused while its holder believed it held", w)})
		}
	}
	return bad
}

// overlaps returns the moments at which more holders believed they held
// than the kind allows: a section believes from its take's return to its
// give's call.
func overlaps(n int, sections [][2]holdOp) []int64 {
	type edge struct {
		at     int64
		delta  int // +1 in, -1 out
		shared bool
	}
	var edges []edge
	for _, s := range sections {
		if s[0].Return < s[1].Call {
			edges = append(edges, edge{s[0].Return, 1, s[0].Shared}, edge{s[1].Call, -1, s[0].Shared})
		}
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at != edges[j].at {
			return edges[i].at < edges[j].at
		}
		return edges[i].delta < edges[j].delta // out before in
	})
	var shares, exclusive int
	var bad []int64
	for _, e := range edges {
		if e.shared {
			shares += e.delta
		} else {
			exclusive += e.delta
		}
		if e.delta > 0 && (exclusive > 1 || exclusive > 0 && shares > 0 || n > 0 && shares > n) {
			bad = append(bad, e.at)
		}
	}
	return bad
}

// explain returns the sections that believed at moment at, and the faults
// of the 3 s before it.
func (nm *nemesis) explain(at int64, key string, sections [][2]holdOp, released map[[2]holdOp]bool, owners map[holdOp]string) string {
	var b strings.Builder
	ts := func(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000000") }
	fmt.Fprintf(&b, "  at %s:\n", ts(at))
	clients := map[string]int{}
	for take, owner := range owners {
		clients[owner] = take.Client
	}
	for _, s := range sections {
		if s[0].Return <= at && at < s[1].Call {
			fmt.Fprintf(&b, "    client %d shared=%v owner %s: take [%s, %s], give [%s, %s], released %v\n", s[0].Client, s[0].Shared,
				owners[s[0]], ts(s[0].Call), ts(s[0].Return), ts(s[1].Call), ts(s[1].Return), released[s])
		}
	}
	for _, e := range nm.audit {
		if e.key == key && e.at > at-int64(2*time.Second) && e.at < at+int64(300*time.Millisecond) {
			who := "missing"
			if e.value != "" {
				who = fmt.Sprintf("%.12s (client %d)", e.value, clients[e.value])
			}
			fmt.Fprintf(&b, "    server %d at %s: %s\n", e.server, ts(e.at), who)
		}
	}
	b.WriteString(nm.faultsBefore(at))
	return b.String()
}

// explainIllegal returns the last operations of the shortest prefix of
// ops (in the order of their calls) that porcupine finds no order for,
// with the faults before the last.
func (nm *nemesis) explainIllegal(n int, ops []holdOp, owners map[holdOp]string) string {
	ops = slices.Clone(ops)
	slices.SortFunc(ops, func(a, b holdOp) int { return cmp.Compare(a.Call, b.Call) })
	lo, hi := 1, len(ops)
	for lo < hi {
		if mid := (lo + hi) / 2; checkHolders(n, ops[:mid]) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	end := lo
	var b strings.Builder
	ts := func(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000000") }
	for _, op := range ops[max(0, end-8):end] {
		fmt.Fprintf(&b, "    client %d take=%v shared=%v [%s, %s] %s\n", op.Client, op.Take, op.Shared, ts(op.Call), ts(op.Return), owners[op])
	}
	b.WriteString(nm.faultsBefore(ops[end-1].Call))
	return b.String()
}

// faultsBefore returns the faults of the 3 s before moment at (and of the
// 300 ms after), a line each.
func (nm *nemesis) faultsBefore(at int64) string {
	var b strings.Builder
	for _, line := range nm.log {
		when, what, _ := strings.Cut(line, " ")
		if ns, _ := strconv.ParseInt(when, 10, 64); ns > at-int64(3*time.Second) && ns <= at+int64(300*time.Millisecond) {
			fmt.Fprintf(&b, "    fault at %s: %s\n", time.Unix(0, ns).Format("15:04:05.000000"), what)
		}
	}
	return b.String()
}

// nemesisDuration is how long the nemesis runs with WithReplicas:
// REDISLOCK_NEMESIS (a duration), 60 s by default.
func nemesisDuration(t *testing.T) time.Duration {
	d := 60 * time.Second
	if v := os.Getenv("REDISLOCK_NEMESIS"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d <= 0 {
			t.Fatalf("REDISLOCK_NEMESIS=%q: want a positive duration", v)
		}
	}
	return d
}

// TestNemesis runs the nemesis for REDISLOCK_NEMESIS (60 s) with
// WithReplicas(1), where it promises no violation, then for a third of
// that without, where it measures them.
func TestNemesis(t *testing.T) {
	d := nemesisDuration(t)
	t.Run("WithReplicas(1)", func(t *testing.T) { runNemesis(t, 1, d) })
	t.Run("without WithReplicas", func(t *testing.T) { runNemesis(t, 0, d/3) })
}

// nemesis is one run: the set, the children, and the faults' counts.
type nemesis struct {
	t        *testing.T
	set      *sentinelSet
	admins   []*redis.Client // of each server, direct
	env      []string        // of the children
	dir      string
	replicas int

	mu        sync.Mutex
	faults    map[string]int
	log       []string // each fault and its time, for a report of violations
	children  []*nemesisWorkers
	killed    map[int]int64 // a killed child's first client: when
	failovers []int64       // when a replica was promoted
	audit     []auditEntry  // what each server's lock keys held, as it changed
	lagging   int           // failovers to a replica that lagged
	nextBase  int
}

// nemesisWorkers is a child process of workers.
type nemesisWorkers struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	base  int
	dead  bool
}

func (nm *nemesis) count(kind string) {
	nm.mu.Lock()
	nm.faults[kind]++
	nm.log = append(nm.log, fmt.Sprintf("%d %s", time.Now().UnixNano(), kind))
	nm.mu.Unlock()
}

// auditEntry is a value a server's key took, seen at at ("" missing).
type auditEntry struct {
	at         int64
	server     int
	key, value string
}

// auditKeys polls every server for the keys of the locks every 2 ms, and
// records each change of what they hold, until ctx ends.
func (nm *nemesis) auditKeys(ctx context.Context, wg *sync.WaitGroup) {
	var keys []string
	for _, p := range nemesisPrimitives {
		if p.n == 1 {
			keys = append(keys, p.key)
		}
	}
	for i, srv := range nm.set.servers {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
			ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			last := map[string]string{}
			for ctx.Err() == nil {
				cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.Get(ctx, k)
					}
					return nil
				})
				now := time.Now().UnixNano()
				for j, cmd := range cmds {
					v, err := cmd.(*redis.StringCmd).Result()
					if err != nil && !errors.Is(err, redis.Nil) {
						continue
					}
					if v != last[keys[j]] {
						last[keys[j]] = v
						nm.mu.Lock()
						nm.audit = append(nm.audit, auditEntry{now, i, keys[j], v})
						nm.mu.Unlock()
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
}

// note adds what happened to the log of faults.
func (nm *nemesis) note(format string, args ...any) {
	nm.mu.Lock()
	nm.log = append(nm.log, fmt.Sprintf("%d ", time.Now().UnixNano())+fmt.Sprintf(format, args...))
	nm.mu.Unlock()
}

// startChild starts a child of workers with clients from the next base.
func (nm *nemesis) startChild() {
	nm.mu.Lock()
	base := nm.nextBase
	nm.nextBase += 100
	nm.mu.Unlock()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childRoleEnv+"=nemesis", "NEMESIS_BASE="+strconv.Itoa(base),
		"NEMESIS_HISTORY="+filepath.Join(nm.dir, "history-"+strconv.Itoa(base))), nm.env...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	r, w, err := os.Pipe()
	if err != nil {
		nm.t.Fatal(err)
	}
	cmd.ExtraFiles = []*os.File{w}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		nm.t.Fatal(err)
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		nm.t.Fatal(err)
	}
	nm.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); r.Close() })
	child := &nemesisWorkers{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(r), base: base}
	expectLine(nm.t, child.lines, "started")
	nm.note("  child %d started", base)
	nm.mu.Lock()
	nm.children = append(nm.children, child)
	nm.mu.Unlock()
}

// aliveChild returns a child that runs, or nil.
func (nm *nemesis) aliveChild() *nemesisWorkers {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	var alive []*nemesisWorkers
	for _, c := range nm.children {
		if !c.dead {
			alive = append(alive, c)
		}
	}
	if len(alive) == 0 {
		return nil
	}
	return alive[rand.IntN(len(alive))]
}

// settle makes every server the Sentinel does not report as the primary
// a replica of the one it does, as the Sentinel would once it notices,
// and waits (a while) for the primary to count its replica online.
func (nm *nemesis) settle() {
	ctx := context.Background()
	var p int
	waitFor(nm.t, 30*time.Second, "the Sentinel to name a primary", func() bool { p = nm.set.primary(); return p >= 0 })
	for i, a := range nm.admins {
		if i != p && strings.Contains(a.Info(ctx, "replication").Val(), "role:master") {
			_, port, _ := strings.Cut(nm.set.repl[p].Addr(), ":")
			nm.note("  settle: server %d made a replica of %d", i, p)
			a.Do(ctx, "REPLICAOF", "127.0.0.1", port)
		}
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		info := nm.admins[p].Info(ctx, "replication").Val()
		if strings.Contains(info, "role:master") && strings.Contains(info, "state=online") {
			return
		}
	}
}

// failOver has the Sentinel promote the replica, and records when; a
// lagging replica is promoted while the primary is cut off from it and
// from the Sentinel.
func (nm *nemesis) failOver(lagging bool) {
	ctx := context.Background()
	p := nm.set.primary()
	if p < 0 {
		return
	}
	if lagging {
		nm.set.repl[p].hold()
		time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond) // writes the replica misses
		defer nm.set.repl[p].release()
	}
	accepted := false
	for deadline := time.Now().Add(10 * time.Second); !accepted && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		accepted = nm.set.sc.Failover(ctx, "mymaster").Err() == nil // NOGOODSLAVE, INPROG: a moment
	}
	for deadline := time.Now().Add(15 * time.Second); accepted && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r := nm.set.primary(); r >= 0 && r != p {
			nm.mu.Lock()
			nm.failovers = append(nm.failovers, time.Now().UnixNano())
			nm.log = append(nm.log, fmt.Sprintf("%d   server %d promoted", time.Now().UnixNano(), r))
			if lagging {
				nm.lagging++
			}
			nm.mu.Unlock()
			return
		}
	}
	nm.t.Logf("nemesis: no failover (lagging %v)", lagging)
}

// serverFault is one fault of the servers, run one at a time.
type serverFault struct {
	name string
	run  func(nm *nemesis)
}

var serverFaultKinds = []serverFault{
	{"SIGSTOP of a server", func(nm *nemesis) {
		i := rand.IntN(len(nm.set.servers))
		nm.note("  server %d stopped (primary %d)", i, nm.set.primary())
		nm.set.servers[i].Signal(nm.t, syscall.SIGSTOP)
		time.Sleep(time.Duration(300+rand.IntN(1200)) * time.Millisecond)
		nm.set.servers[i].Signal(nm.t, syscall.SIGCONT)
	}},
	{"kill -9 and restart of a server", func(nm *nemesis) {
		i := rand.IntN(len(nm.set.servers))
		nm.note("  server %d killed (primary %d)", i, nm.set.primary())
		nm.set.servers[i].Stop()
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Millisecond)
		nm.set.restart(nm.t, i)
		nm.note("  server %d restarted", i)
	}},
	{"DEBUG SLEEP of the primary", func(nm *nemesis) {
		if p := nm.set.primary(); p >= 0 {
			nm.admins[p].Do(context.Background(), "DEBUG", "SLEEP", fmt.Sprintf("%.1f", 0.2+rand.Float64()))
		}
	}},
	{"Sentinel failover", func(nm *nemesis) { nm.failOver(false) }},
	{"Sentinel failover to a lagging replica", func(nm *nemesis) { nm.failOver(true) }},
}

// lightFaults are the faults that run beside the others, overlapping.
var lightFaults = []serverFault{
	{"CLIENT KILL TYPE normal", func(nm *nemesis) {
		nm.onPrimary(func(a *redis.Client) { a.ClientKillByFilter(context.Background(), "TYPE", "normal", "SKIPME", "yes") })
	}},
	{"CLIENT KILL TYPE pubsub", func(nm *nemesis) {
		nm.onPrimary(func(a *redis.Client) { a.ClientKillByFilter(context.Background(), "TYPE", "pubsub") })
	}},
	{"SCRIPT FLUSH", func(nm *nemesis) { nm.onPrimary(func(a *redis.Client) { a.ScriptFlush(context.Background()) }) }},
	{"CLIENT PAUSE WRITE", func(nm *nemesis) {
		nm.onPrimary(func(a *redis.Client) { a.Do(context.Background(), "CLIENT", "PAUSE", 100+rand.IntN(400), "WRITE") })
	}},
	{"memory full", func(nm *nemesis) {
		nm.onPrimary(func(a *redis.Client) {
			ctx := context.Background()
			a.ConfigSet(ctx, "maxmemory-policy", "noeviction")
			a.ConfigSet(ctx, "maxmemory", "1")
			time.Sleep(time.Duration(100+rand.IntN(400)) * time.Millisecond)
			a.ConfigSet(ctx, "maxmemory", "0")
		})
	}},
	{"replies dropped after the server ran a script", func(nm *nemesis) {
		if p := nm.set.primary(); p >= 0 {
			nm.set.front[p].dropReplies.Store(int64(1 + rand.IntN(3)))
		}
	}},
	{"holder process SIGKILLed", func(nm *nemesis) {
		if c := nm.aliveChild(); c != nil {
			nm.mu.Lock()
			c.dead = true
			nm.killed[c.base] = time.Now().UnixNano()
			nm.mu.Unlock()
			nm.note("  child %d killed", c.base)
			_ = c.cmd.Process.Signal(syscall.SIGKILL)
		}
	}},
	{"holder process SIGSTOPped past its lease", func(nm *nemesis) {
		if c := nm.aliveChild(); c != nil {
			nm.note("  child %d stopped", c.base)
			_ = c.cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(nemesisLease + time.Duration(200+rand.IntN(600))*time.Millisecond)
			_ = c.cmd.Process.Signal(syscall.SIGCONT)
			nm.note("  child %d continued", c.base)
		}
	}},
}

// onPrimary runs f with the primary's admin client, if there is one.
func (nm *nemesis) onPrimary(f func(*redis.Client)) {
	if p := nm.set.primary(); p >= 0 {
		f(nm.admins[p])
	}
}

func runNemesis(t *testing.T, replicas int, d time.Duration) {
	shm := "/dev/shm"
	if _, err := os.Stat(shm); err != nil {
		shm = "" // fsync on the test's disk: slower
	}
	dirs := make([]string, 2)
	for i := range dirs {
		dir, err := os.MkdirTemp(shm, "redislock-nemesis-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		dirs[i] = dir
	}
	set := startSentinelSet(t, 1, func(i int) []string {
		return []string{"--dir", dirs[i], "--appendonly", "yes", "--appendfsync", "always"}
	}, "sentinel failover-timeout mymaster 3000")
	nm := &nemesis{t: t, set: set, dir: t.TempDir(), replicas: replicas, faults: map[string]int{}, killed: map[int]int64{}}
	if keep := os.Getenv("REDISLOCK_NEMESIS_KEEP"); keep != "" { // the histories, and a trace of the children's commands
		var err error
		if nm.dir, err = os.MkdirTemp(keep, "nemesis-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("nemesis: histories kept in %s", nm.dir)
	}
	for _, s := range set.servers {
		nm.admins = append(nm.admins, s.Client(t))
	}
	var dial []string
	for i := range set.repl {
		dial = append(dial, set.repl[i].Addr()+"="+set.front[i].Addr())
	}
	nm.env = []string{"NEMESIS_SENTINEL=" + set.sentinel.Addr, "NEMESIS_DIAL=" + strings.Join(dial, ","),
		"NEMESIS_RESOURCE=" + redisserver.Start(t).Addr, "NEMESIS_REPLICAS=" + strconv.Itoa(replicas)}
	auditCtx, stopAudit := context.WithCancel(context.Background())
	var audit sync.WaitGroup
	nm.auditKeys(auditCtx, &audit)
	for range 3 {
		nm.startChild()
	}

	// Faults beside the others, overlapping: one every 100-400 ms, each in
	// a goroutine of its own.
	ctx, stop := context.WithCancel(context.Background())
	var light sync.WaitGroup
	light.Add(1)
	go func() {
		defer light.Done()
		for ctx.Err() == nil {
			f := lightFaults[rand.IntN(len(lightFaults))]
			nm.count(f.name)
			light.Add(1)
			go func() { defer light.Done(); f.run(nm) }()
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(100+rand.IntN(300)) * time.Millisecond):
			}
		}
	}()
	// The servers' faults, one at a time, in a shuffled round of all, and
	// killed processes replaced.
	kinds := serverFaultKinds
	if replicas == 0 { // what it measures: failovers to a lagging replica
		kinds = slices.DeleteFunc(slices.Clone(kinds), func(f serverFault) bool { return f.name != "Sentinel failover to a lagging replica" })
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		for _, k := range rand.Perm(len(kinds)) {
			if !time.Now().Before(deadline) {
				break
			}
			f := kinds[k]
			nm.count(f.name)
			f.run(nm)
			nm.settle()
			for nm.aliveCount() < 3 {
				nm.startChild() // in place of one killed
			}
			time.Sleep(time.Duration(200+rand.IntN(400)) * time.Millisecond)
		}
	}
	stop()
	light.Wait()
	for _, p := range append(set.repl, set.front...) {
		p.release()
		p.dropReplies.Store(0)
	}
	for _, a := range nm.admins {
		a.ConfigSet(context.Background(), "maxmemory", "0")
	}
	nm.settle()
	for _, c := range nm.children {
		if c.dead {
			continue
		}
		_ = c.cmd.Process.Signal(syscall.SIGCONT)
		c.stdin.Close()
	}
	for _, c := range nm.children {
		if c.dead {
			continue
		}
		expectLine(t, c.lines, "done")
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child %d: %v", c.base, err)
		}
	}
	stopAudit()
	audit.Wait()
	if os.Getenv("REDISLOCK_NEMESIS_KEEP") != "" {
		var b strings.Builder
		for _, line := range nm.log {
			fmt.Fprintln(&b, line)
		}
		for base, at := range nm.killed {
			fmt.Fprintf(&b, "%d killed %d\n", at, base)
		}
		for _, e := range nm.audit {
			fmt.Fprintf(&b, "%d audit %d %s %s\n", e.at, e.server, e.key, e.value)
		}
		_ = os.WriteFile(filepath.Join(nm.dir, "log"), []byte(b.String()), 0o644)
	}
	nm.check(d)
}

// aliveCount returns how many children run.
func (nm *nemesis) aliveCount() int {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	n := 0
	for _, c := range nm.children {
		if !c.dead {
			n++
		}
	}
	return n
}

// check reads the histories, checks them, and reports a line per
// primitive.
func (nm *nemesis) check(d time.Duration) {
	t := nm.t
	paths, _ := filepath.Glob(filepath.Join(nm.dir, "history-*"))
	holds := make([][]holdOp, len(nemesisPrimitives))
	sections := make([][][2]holdOp, len(nemesisPrimitives))
	writes := make([][]fencedOp, len(nemesisPrimitives))
	kept := 0
	released := map[[2]holdOp]bool{}
	owners := map[holdOp]string{} // each take's owner id
	for _, path := range paths {
		base, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(path), "history-"))
		if err != nil {
			continue // a trace
		}
		ops, err := parseNemesisOps(path)
		if err != nil {
			t.Fatal(err)
		}
		open := map[int]nemesisOp{}    // each client's take without its give yet
		until := map[int]int64{}       // and the end of its lease it knew last
		writing := map[int]nemesisOp{} // and its fenced write sent, without its outcome yet
		for _, op := range ops {
			switch {
			case op.intent:
				writing[op.fenced.Client] = op
				continue
			case op.fenced != nil:
				delete(writing, op.fenced.Client)
				writes[op.prim] = append(writes[op.prim], *op.fenced)
				continue
			case op.until != 0:
				until[op.hold.Client] = op.until
				continue
			case op.giving != 0:
				until[op.hold.Client] = op.giving
				continue
			}
			holds[op.prim] = append(holds[op.prim], op.hold)
			if op.hold.Take {
				open[op.hold.Client] = op
				owners[op.hold] = op.owner
				delete(until, op.hold.Client) // a former section's
				continue
			}
			take, ok := open[op.hold.Client]
			if !ok {
				t.Errorf("client %d gave %s back without a take in %s", op.hold.Client, nemesisPrimitives[op.prim].name, path)
				continue
			}
			delete(open, op.hold.Client)
			sections[op.prim] = append(sections[op.prim], [2]holdOp{take.hold, op.hold})
			released[[2]holdOp{take.hold, op.hold}] = op.released
			for _, at := range nm.failovers {
				if op.released && take.hold.Return < at && at < op.hold.Call {
					kept++ // held across a failover, and released as held
					break
				}
			}
		}
		for _, w := range writing { // its process was killed as it wrote: the write may have run, until a while after
			at, ok := nm.killed[base]
			if !ok {
				t.Errorf("client %d began a fenced write and never ended it", w.fenced.Client)
				continue
			}
			w.fenced.Return = max(at, w.fenced.Call) + int64(time.Second)
			writes[w.prim] = append(writes[w.prim], *w.fenced)
		}
		for _, take := range open { // its process was killed holding: it believed until then, or its lease's end
			at, ok := nm.killed[base]
			if !ok {
				t.Errorf("client %d took %s and never gave it back", take.hold.Client, nemesisPrimitives[take.prim].name)
				continue
			}
			if u, ok := until[take.hold.Client]; ok && u < at {
				at = u // stopped before it was killed
			}
			at = max(at, take.hold.Return)
			give := holdOp{Client: take.hold.Client, Shared: take.hold.Shared, Call: at, Return: at + int64(nemesisLease)}
			holds[take.prim] = append(holds[take.prim], give)
			sections[take.prim] = append(sections[take.prim], [2]holdOp{take.hold, give})
		}
	}
	injected := 0
	var kinds []string
	for k, n := range nm.faults {
		injected += n
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(kinds)
	name, label := "33. nemesis, WithReplicas(1)", "WithReplicas(1)"
	if nm.replicas == 0 {
		name, label = "33b. nemesis, without WithReplicas", "without WithReplicas"
	}
	var total int64
	for i, p := range nemesisPrimitives {
		moments := overlaps(p.n, sections[i])
		violations := len(moments)
		if violations > 0 && nm.replicas > 0 {
			var b strings.Builder
			for _, at := range moments[:min(len(moments), 5)] {
				b.WriteString(nm.explain(at, p.key, sections[i], released, owners))
			}
			t.Errorf("%s: %d moments with more holders than %s allows; the first:\n%s", p.name, violations, p.name, b.String())
		}
		history := make([]porcupine.Operation, len(holds[i]))
		for j, op := range holds[i] {
			history[j] = porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Return: op.Return}
		}
		verdict := porcupine.CheckOperationsTimeout(holdersModel(p.n), history, time.Minute)
		if p.fenced {
			if bad := fencingViolations(writes[i]); len(bad) > 0 {
				violations += len(bad)
				if nm.replicas > 0 {
					var b strings.Builder
					for _, v := range bad[:min(len(bad), 5)] {
						fmt.Fprintf(&b, "  %s\n%s", v.what, nm.faultsBefore(v.at))
					}
					t.Errorf("%s: %d fenced writes, %d break fencing's promises; the first:\n%s", p.name, len(writes[i]), len(bad), b.String())
				}
			}
		}
		if verdict == porcupine.Illegal && violations == 0 {
			violations = 1
			if nm.replicas > 0 {
				t.Errorf("%s: porcupine finds no order for the sections, although no two believed at once:\n%s", p.name, nm.explainIllegal(p.n, holds[i], owners))
			}
		} else if verdict == porcupine.Unknown {
			t.Errorf("%s: %d operations not decided in a minute", p.name, len(holds[i]))
		}
		if len(sections[i]) < 20 {
			t.Errorf("%s: only %d sections", p.name, len(sections[i]))
		}
		total += int64(violations)
		model := map[int]string{0: "readers-writers", 1: "a lock", 2: "a semaphore of 2"}[p.n]
		if p.election {
			model = "one leader at a time"
		}
		promise := "porcupine finds " + model + " that explains every section; no two holders believe at once beyond the kind's bound"
		if p.fenced {
			promise += "; a fenced write that began after another returned has a higher token, and none is refused while its holder believes it holds"
		}
		recordFault(t, faultRow{Case: name + ": " + p.name, Injection: fmt.Sprintf("every primitive at once, %d workers in 3 processes, for %v; the faults below", 3*(p.workers+p.writers), d),
			Promise: promise,
			Runs:    int64(len(sections[i])), Faults: int64(injected), Violations: int64(violations), Measured: nm.replicas == 0})
	}
	nm.mu.Lock()
	defer nm.mu.Unlock()
	summary := fmt.Sprintf("nemesis (%s, %v): %d faults (%s); %d failovers, %d of them to a lagging replica; %d holds released after a failover they were held across; %d violations",
		label, d, injected, strings.Join(kinds, ", "), len(nm.failovers), nm.lagging, kept, total)
	t.Log(summary)
	faultReport.Lock()
	faultReport.summary = append(faultReport.summary, summary)
	faultReport.Unlock()
}

// The nemesis's fencing check passes sequential writes and a stale
// holder's refused write, and catches a token that went back and a write
// refused while its holder believed it held.
func TestFencingViolations(t *testing.T) {
	const ms = int64(time.Millisecond)
	good := []fencedOp{
		{Client: 0, Token: 10, Read: 0, Accepted: true, Call: 1 * ms, Return: 2 * ms},
		// A holder stopped between its read and its write: its call is
		// before the next holder's, its write refused after.
		{Client: 1, Token: 11, Read: 1, Call: 3 * ms, Return: 9 * ms},
		{Client: 2, Token: 12, Read: 1, Accepted: true, Call: 5 * ms, Return: 6 * ms},
		{Client: 0, Token: 13, Read: 2, Unknown: true, Call: 10 * ms, Return: 11 * ms},
	}
	if bad := fencingViolations(good); len(bad) > 0 {
		t.Fatalf("fencing's promises kept, yet: %v", bad)
	}
	back := append(slices.Clone(good), fencedOp{Client: 3, Token: 12, Read: 2, Accepted: true, Call: 12 * ms, Return: 13 * ms})
	if bad := fencingViolations(back); len(bad) != 1 || !strings.Contains(bad[0].what, "token 12") || bad[0].at != 12*ms {
		t.Errorf("a token lower than an earlier write's: %v", bad)
	}
	held := append(slices.Clone(good), fencedOp{Client: 3, Token: 14, Read: 2, Held: true, Call: 12 * ms, Return: 13 * ms})
	if bad := fencingViolations(held); len(bad) != 1 || !strings.Contains(bad[0].what, "believed it held") {
		t.Errorf("a write refused while its holder believed it held: %v", bad)
	}
}
