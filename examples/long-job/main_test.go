package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
	"github.com/redislock/redislock/internal/redisserver"
)

// TestMain runs main instead of the tests when a test runs this binary as
// the job under "redislock run".
func TestMain(m *testing.M) {
	if os.Getenv("LONG_JOB_CHILD") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// syncBuffer is an io.Writer that tests can read while the job writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitOutput waits (30 s at most) until out contains want.
func waitOutput(t *testing.T, out *syncBuffer, want string) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %q in the output:\n%s", want, out.String())
		}
	}
}

// keyHolders samples the lock's key until stop is closed, and returns the
// distinct owners it saw, in order.
func keyHolders(admin *redis.Client, key string, stop <-chan struct{}) <-chan []string {
	seen := make(chan []string, 1)
	go func() {
		var owners []string
		for {
			if v, err := admin.Get(context.Background(), key).Result(); err == nil && (len(owners) == 0 || owners[len(owners)-1] != v) {
				owners = append(owners, v)
			}
			select {
			case <-stop:
				seen <- owners
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return seen
}

// TestJobOutlivesItsLease: a job of 8 leases finishes under one hold, the
// same owner's all along, and releases the lock.
func TestJobOutlivesItsLease(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	stop := make(chan struct{})
	holders := keyHolders(admin, "nightly", stop)
	var out syncBuffer
	c := config{key: "nightly", steps: 8, step: 300 * time.Millisecond, lease: 300 * time.Millisecond, maxHold: time.Minute}
	done, err := job(context.Background(), c, srv.Client(t), &out)
	close(stop)
	if err != nil || done != 8 {
		t.Fatalf("job = %d, %v; want 8, nil\n%s", done, err, out.String())
	}
	if owners := <-holders; len(owners) != 1 {
		t.Fatalf("the key held %v during the job; want one owner", owners)
	}
	if admin.Exists(context.Background(), "nightly").Val() != 0 {
		t.Fatal("the lock was not released")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 10 || !strings.HasPrefix(lines[8], "step 8/8 done (held until ") || lines[9] != "all 8 steps done; lock released" {
		t.Fatalf("output:\n%s", out.String())
	}
}

// TestJobStopsOnLoss deletes the key under the job, as "redislock break"
// would: the job learns at its next renewal, abandons its step, returns
// ErrLockLost, and never takes the lock again.
func TestJobStopsOnLoss(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	var out syncBuffer
	c := config{key: "nightly", steps: 100, step: 100 * time.Millisecond, lease: 300 * time.Millisecond, maxHold: time.Minute}
	type result struct {
		done int
		err  error
	}
	res := make(chan result, 1)
	go func() {
		done, err := job(context.Background(), c, srv.Client(t), &out)
		res <- result{done, err}
	}()
	waitOutput(t, &out, "step 3/100 done")
	op := redislock.NewRedisLock(redislock.FromGoRedis(admin), "nightly")
	st, err := op.Break(context.Background(), "")
	if err != nil || !st.Held {
		t.Fatalf("Break = %+v, %v", st, err)
	}
	r := <-res
	if !errors.Is(r.err, redislock.ErrLockLost) || r.done >= 100 {
		t.Fatalf("job = %d, %v; want it stopped with ErrLockLost", r.done, r.err)
	}
	if !strings.HasSuffix(out.String(), "stopped cleanly after "+itoa(r.done)+" of 100 steps: "+r.err.Error()+"\n") {
		t.Fatalf("output:\n%s", out.String())
	}
	if strings.Contains(out.String(), "step "+itoa(r.done+1)+"/100") {
		t.Fatalf("a step finished after the job stopped:\n%s", out.String())
	}
	if admin.Exists(context.Background(), "nightly").Val() != 0 {
		t.Fatal("the lost lock was taken again")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestJobMaxHold: WithMaxHold ends a job that runs too long, and releases
// the lock.
func TestJobMaxHold(t *testing.T) {
	srv := redisserver.Start(t)
	var out syncBuffer
	c := config{key: "nightly", steps: 100, step: 100 * time.Millisecond, lease: 300 * time.Millisecond, maxHold: 700 * time.Millisecond}
	done, err := job(context.Background(), c, srv.Client(t), &out)
	if !errors.Is(err, redislock.ErrMaxHoldExceeded) || done >= 100 {
		t.Fatalf("job = %d, %v; want it stopped at its maximum hold", done, err)
	}
	if srv.Client(t).Exists(context.Background(), "nightly").Val() != 0 {
		t.Fatal("the lock was not released at the maximum hold")
	}
}

// TestUnderRedislockRun runs the job with -under-run under the redislock
// command, built from this module: it finishes and exits 0; and when the
// lock is broken, redislock stops it with SIGTERM, the job stops cleanly
// between steps, and redislock exits 70.
func TestUnderRedislockRun(t *testing.T) {
	srv := redisserver.Start(t)
	bin := filepath.Join(t.TempDir(), "redislock")
	build := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", bin, "github.com/redislock/redislock/cmd/redislock")...)
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, msg)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runJob := func(steps string, out *syncBuffer) *exec.Cmd {
		cmd := exec.Command(bin, "run", "-addr", srv.Addr, "-ttl", "300ms", "-grace", "20s", "nightly", "--",
			self, "-under-run", "-steps", steps, "-step", "100ms")
		cmd.Env = append(os.Environ(), "LONG_JOB_CHILD=1")
		cmd.Stdout, cmd.Stderr = out, out
		return cmd
	}

	var out syncBuffer
	if err := runJob("6", &out).Run(); err != nil {
		t.Fatalf("redislock run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "all 6 steps done\n") || !strings.Contains(out.String(), "under redislock run as owner ") {
		t.Fatalf("output:\n%s", out.String())
	}

	var lost syncBuffer
	cmd := runJob("300", &lost)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, &lost, "step 2/300 done")
	owner := strings.TrimSuffix(strings.Fields(strings.SplitAfter(lost.String(), "as owner ")[1])[0], ":")
	op := redislock.NewRedisLock(redislock.FromGoRedis(srv.Client(t)), "nightly")
	if st, err := op.Break(context.Background(), owner); err != nil || st.Owner != owner {
		t.Fatalf("Break(%s) = %+v, %v", owner, st, err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 70 {
		t.Fatalf("redislock run: %v, want exit 70\n%s", err, lost.String())
	}
	if !strings.Contains(lost.String(), "stopped cleanly after ") || !strings.Contains(lost.String(), "lock lost") {
		t.Fatalf("output:\n%s", lost.String())
	}
}
