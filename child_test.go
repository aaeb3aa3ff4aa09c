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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Some fault cases need holders in processes of their own: the test binary
// runs itself again with childRoleEnv naming the role, and TestMain hands
// over to runChild. Children talk to the parent in lines on stdout.

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
// returns it with a reader of its stdout lines.
func startChild(t *testing.T, role string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childRoleEnv+"="+role), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewScanner(out)
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
	var err error
	switch role {
	case "paused-holder":
		err = pausedHolder(os.Stdout)
	default:
		err = fmt.Errorf("unknown child role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// pausedHolder takes a fenced lock and writes once with its token; then it
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
	rl := NewRedisLock(FromGoRedis(c), key, WithExpiry(lease), WithFencing())
	if ok, err := rl.Acquire(); !ok || err != nil {
		return fmt.Errorf("acquire: %v, %v", ok, err)
	}
	defer rl.Release()
	token := rl.Token()
	if n, err := fenceWrite.Run(ctx, c, []string{key + ":resource"}, token).Int(); err != nil || n != 1 {
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
			n, err := fenceWrite.Run(ctx, c, []string{key + ":resource"}, token).Int()
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

func parseInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
