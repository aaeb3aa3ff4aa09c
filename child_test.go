package redislock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
)

// Some fault cases need holders in processes of their own: the test binary
// runs itself again with childRoleEnv naming the role, and TestMain hands
// over to runChild. Children talk to the parent in lines on a pipe of
// their own (file descriptor 3), not on stdout, where libraries may print:
// go-zero's logx writes a usage line to stdout every minute.

const childRoleEnv = "REDISLOCK_TEST_CHILD"

// fenceWrite is the protected resource of the fault suite: a hash that
// records the highest token it has seen and refuses lower ones. It replies
// 1 for an accepted write, 0 for a refused one.
var fenceWrite = redis.NewScript(`
local highest = tonumber(redis.call("HGET", KEYS[1], "token") or "0")
if tonumber(ARGV[1]) < highest then
  return 0
end
redis.call("HSET", KEYS[1], "token", ARGV[1])
return 1`)

// startChild runs this test binary as a child in role, with env, and
// returns it with a reader of the lines it reports. Whatever the child
// prints on stdout or stderr goes to the test's stderr.
func startChild(t *testing.T, role string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childRoleEnv+"="+role), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{w} // the child's fd 3
	err = cmd.Start()
	w.Close() // the child has its copy; reads end when the child exits
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); r.Close() })
	return cmd, bufio.NewScanner(r)
}

// TestChildReportsOnItsOwnPipe: what a child prints on stdout does not
// reach the parent's reader. A hammer child once ran past a minute, and
// go-zero's usage log on stdout took the place of its "done".
func TestChildReportsOnItsOwnPipe(t *testing.T) {
	cmd, lines := startChild(t, "noisy")
	expectLine(t, lines, "reported")
	if lines.Scan() {
		t.Errorf("the child reported %q after its last line", lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// expectLine reads the child's next line, which must start with prefix, and
// returns its fields after the prefix.
func expectLine(t *testing.T, sc *bufio.Scanner, prefix string) []string {
	t.Helper()
	if !sc.Scan() {
		t.Fatalf("child ended before %q: %v", prefix, sc.Err())
	}
	f := strings.Fields(sc.Text())
	if len(f) == 0 || f[0] != prefix {
		t.Fatalf("child said %q, want %q", sc.Text(), prefix)
	}
	return f[1:]
}

func runChild(role string) int {
	logx.SetWriter(logx.NewWriter(os.Stderr))
	logx.DisableStat()
	report := os.NewFile(3, "report") // see startChild
	defer report.Close()
	var err error
	switch role {
	case "paused-holder":
		err = pausedHolder(report)
	case "hammer":
		err = hammerChild(report)
	case "fair-waiter":
		err = fairWaiterChild(report)
	case "nemesis":
		err = nemesisChild(report)
	case "noisy":
		fmt.Println("done 0 0 0 printed on stdout, as go-zero's usage log is")
		logx.Stat("a usage line")
		_, err = fmt.Fprintln(report, "reported")
	default:
		err = fmt.Errorf("unknown child role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// pausedHolder takes a fenced lock and writes once with its token (with
// LOCK_PERMITS, a permit of a semaphore, and writes nothing); then it
// watches its hold in 5ms steps. A step that comes over half a second late
// means the process was stopped and has just resumed. When the hold ends,
// it reports how long after resuming that was, and tries a write with its
// old token.
func pausedHolder(out io.Writer) error {
	addr, key := os.Getenv("REDIS_ADDR"), os.Getenv("LOCK_KEY")
	lease, err := time.ParseDuration(os.Getenv("LOCK_LEASE"))
	if err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	opts := []Option{WithExpiry(lease), WithFencing()}
	permits, _ := strconv.Atoi(os.Getenv("LOCK_PERMITS"))
	if permits > 0 {
		opts = []Option{WithExpiry(lease), WithPermits(permits)}
	}
	rl := NewRedisLock(FromGoRedis(c), key, opts...)
	if err := rl.AcquireWait(ctx); err != nil {
		return fmt.Errorf("acquire: %v", err)
	}
	defer rl.Release()
	token := rl.Token()
	write := func() (int, error) {
		if permits > 0 {
			return 0, nil // no fencing: nothing written
		}
		return fenceWrite.Run(ctx, c, []string{key + ":resource"}, token).Int()
	}
	if n, err := write(); err != nil || n != 1 && permits == 0 {
		return fmt.Errorf("first write: %v, %v", n, err)
	}
	fmt.Fprintln(out, "acquired", token)

	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	last, resumed := time.Now(), time.Time{}
	for {
		select {
		case <-rl.Done():
			switch {
			case resumed.IsZero() && time.Since(last) > 500*time.Millisecond:
				resumed = time.Now() // woke up to Done before any step: just resumed
			case resumed.IsZero():
				resumed = last // never stopped
			}
			n, err := write()
			if err != nil {
				return err
			}
			fmt.Fprintln(out, "lost", time.Since(resumed).Milliseconds(), errors.Is(rl.Err(), ErrLockLost), n == 1)
			return nil
		case now := <-tick.C:
			if now.Sub(last) > 500*time.Millisecond && resumed.IsZero() {
				resumed = now
			}
			last = now
		}
	}
}

// hammerWrite is the read-modify-write of the hammer: it sets the counter
// KEYS[1] to ARGV[2] if the token ARGV[1] is higher than every token seen
// before, and replies 1; otherwise it changes nothing and replies 0.
var hammerWrite = redis.NewScript(`
local highest = tonumber(redis.call("HGET", KEYS[1], "token") or "0")
if tonumber(ARGV[1]) <= highest then
  return 0
end
redis.call("HSET", KEYS[1], "token", ARGV[1], "count", ARGV[2])
return 1`)

// hammerChild runs HAMMER_GOROUTINES goroutines, each with a fenced
// RedisLock on one of HAMMER_KEYS keys, until HAMMER_ACQUISITIONS
// acquisitions are done between them. Under each hold it reads the key's
// counter and writes it back incremented, fenced. It reports the
// increments that were accepted, the writes refused as out of order, and
// the errors.
func hammerChild(out io.Writer) error {
	addr := os.Getenv("REDIS_ADDR")
	keys, _ := strconv.Atoi(os.Getenv("HAMMER_KEYS"))
	goroutines, _ := strconv.Atoi(os.Getenv("HAMMER_GOROUTINES"))
	total, _ := strconv.ParseInt(os.Getenv("HAMMER_ACQUISITIONS"), 10, 64)
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2 * goroutines})
	defer c.Close()
	ctx := context.Background()
	client, _ := strconv.Atoi(os.Getenv("HAMMER_CLIENT")) // the first client number of this process
	var remaining, accepted, refused, failed atomic.Int64
	remaining.Store(total)
	var wg sync.WaitGroup
	histories := make([][]fencedOp, goroutines)
	for g := 0; g < goroutines; g++ {
		key := fmt.Sprintf("hammer:%d", g%keys)
		opts := []Option{WithFencing(), WithExpiry(2 * time.Second)}
		if os.Getenv("HAMMER_FAIR") != "" {
			opts = append(opts, WithFairness())
		}
		rl := NewRedisLock(FromGoRedis(c), key, opts...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for remaining.Add(-1) >= 0 {
				if err := rl.AcquireWait(ctx); err != nil {
					failed.Add(1)
					continue
				}
				op := fencedOp{Key: key, Client: client + g, Token: rl.Token(), Call: time.Now().UnixNano()}
				n, err := c.HGet(ctx, key+":resource", "count").Int64()
				if err != nil && !errors.Is(err, redis.Nil) {
					failed.Add(1)
				} else if ok, err := hammerWrite.Run(ctx, c, []string{key + ":resource"}, op.Token, n+1).Int(); err != nil {
					failed.Add(1)
				} else {
					op.Read, op.Accepted, op.Return = n, ok == 1, time.Now().UnixNano()
					histories[g] = append(histories[g], op)
					if op.Accepted {
						accepted.Add(1)
					} else {
						refused.Add(1)
					}
				}
				if ok, err := rl.Release(); !ok || err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if path := os.Getenv("HAMMER_HISTORY"); path != "" {
		for _, ops := range histories {
			if err := writeOps(path, ops); err != nil {
				return err
			}
		}
	}
	fmt.Fprintln(out, "done", accepted.Load(), refused.Load(), failed.Load())
	return nil
}

func parseInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
