package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
	"github.com/redislock/redislock/internal/redisserver"
)

// cli is the redislock command (this test binary, run as the command),
// with the marks file F in its environment. Its stderr goes to errOut.
type cli struct {
	cmd    *exec.Cmd
	errOut *bytes.Buffer
}

func newCLI(t *testing.T, marks string, args ...string) *cli {
	c := &cli{cmd: exec.Command(os.Args[0], args...), errOut: &bytes.Buffer{}}
	c.cmd.Env = append(os.Environ(), "REDISLOCK_CLI=1", "F="+marks)
	c.cmd.Stderr = c.errOut
	return c
}

// code runs (or waits for) the command and returns its exit status.
func (c *cli) code(t *testing.T) int {
	t.Helper()
	var err error
	if c.cmd.Process == nil {
		err = c.cmd.Run()
	} else {
		err = c.cmd.Wait()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0
}

func marksFile(t *testing.T) string { return filepath.Join(t.TempDir(), "marks") }

func readMarks(t *testing.T, f string) []string {
	b, err := os.ReadFile(f)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), "\n", " "))
}

// waitMark waits up to 10s for mark in the file.
func waitMark(t *testing.T, f, mark string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		for _, m := range readMarks(t, f) {
			if m == mark {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q mark in %v", mark, readMarks(t, f))
		}
	}
}

func TestRunNeverOverlaps(t *testing.T) {
	srv := redisserver.Start(t)
	f := marksFile(t)
	script := `echo start-$1 >> "$F"; sleep 0.2; echo end-$1 >> "$F"`
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		c := newCLI(t, f, "run", "-addr", srv.Addr, "-wait", "30s", "nightly", "--", "sh", "-c", script, "sh", strconv.Itoa(i))
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = c.code(t) }()
	}
	wg.Wait()
	for i, code := range codes {
		if code != 0 {
			t.Fatalf("run %d exited %d", i, code)
		}
	}
	marks := readMarks(t, f)
	if len(marks) != 8 {
		t.Fatalf("marks %v", marks)
	}
	for i := 0; i < len(marks); i += 2 { // start-N end-N, never interleaved
		if !strings.HasPrefix(marks[i], "start-") || marks[i+1] != "end-"+strings.TrimPrefix(marks[i], "start-") {
			t.Fatalf("runs overlapped: %v", marks)
		}
	}
}

func TestRunBusy(t *testing.T) {
	srv := redisserver.Start(t)
	holder := redislock.NewRedisLock(redislock.FromGoRedis(srv.Client(t)), "busy")
	if ok, err := holder.Acquire(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer holder.Release()
	f := marksFile(t)
	for _, wait := range []string{"0", "300ms"} {
		c := newCLI(t, f, "run", "-addr", srv.Addr, "-wait", wait, "busy", "--", "sh", "-c", `echo ran >> "$F"`)
		if code := c.code(t); code != exitBusy {
			t.Fatalf("-wait %s: exit %d, want %d (busy); stderr %q", wait, code, exitBusy, c.errOut)
		}
		if !strings.Contains(c.errOut.String(), "held by another owner") {
			t.Fatalf("-wait %s: stderr %q does not say why", wait, c.errOut)
		}
	}
	if marks := readMarks(t, f); len(marks) != 0 {
		t.Fatalf("the command ran without the lock: %v", marks)
	}
}

// TestRunLoss deletes the key from outside while the command runs: the
// command gets SIGTERM (and SIGKILL after -grace if it ignores it), and
// run exits 70 saying why.
func TestRunLoss(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	for _, tc := range []struct {
		name, script, stderr string
		extra                []string
	}{
		{"stops on SIGTERM", `trap 'echo stopped >> "$F"; kill $!; exit 0' TERM; echo started >> "$F"; sleep 30 & wait`, "lock lost", nil},
		{"killed after grace", `trap '' TERM; echo started >> "$F"; exec sleep 30`, "killing it", []string{"-grace", "300ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := marksFile(t)
			args := append([]string{"run", "-addr", srv.Addr, "-ttl", "600ms"}, tc.extra...)
			c := newCLI(t, f, append(args, "lossy", "--", "sh", "-c", tc.script)...)
			if err := c.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			waitMark(t, f, "started")
			admin.Del(context.Background(), "lossy")
			if code := c.code(t); code != exitLost {
				t.Fatalf("exit %d, want %d (lost); stderr %q", code, exitLost, c.errOut)
			}
			if !strings.Contains(c.errOut.String(), tc.stderr) {
				t.Fatalf("stderr %q does not say %q", c.errOut, tc.stderr)
			}
			if strings.Contains(c.errOut.String(), "redislock: redislock:") { // found by the black-box review
				t.Fatalf("stderr says the prefix twice: %q", c.errOut)
			}
			if tc.extra == nil {
				waitMark(t, f, "stopped") // its SIGTERM handler ran
			}
		})
	}
}

// TestRunMaxHold: at -max-hold the command gets SIGTERM, the lock is
// released, and run exits 70, as its help says (the black-box review of
// round 5 found the status undocumented).
func TestRunMaxHold(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	f := marksFile(t)
	c := newCLI(t, f, "run", "-addr", srv.Addr, "-max-hold", "300ms", "bounded", "--", "sh", "-c",
		`trap 'echo stopped >> "$F"; kill $!; exit 0' TERM; echo started >> "$F"; sleep 30 & wait`)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitMark(t, f, "started")
	if code := c.code(t); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr %q", code, exitLost, c.errOut)
	}
	waitMark(t, f, "stopped")
	if admin.Exists(context.Background(), "bounded").Val() != 0 {
		t.Fatal("the lock is still held after run exited")
	}
}

func TestRunForwardsSignalsAndReleases(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	f := marksFile(t)
	// SIGHUP and SIGQUIT ended redislock and left the command running
	// without the lock; go-zero's handler took SIGUSR1 and SIGUSR2 (black-box
	// round 18).
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2} {
		c := newCLI(t, f, "run", "-addr", srv.Addr, "signalled", "--", "sh", "-c",
			`trap 'echo got-`+strconv.Itoa(int(sig))+` >> "$F"; kill $!; exit 3' INT TERM HUP QUIT USR1 USR2; echo started-`+strconv.Itoa(int(sig))+` >> "$F"; sleep 30 & wait`)
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitMark(t, f, "started-"+strconv.Itoa(int(sig)))
		if admin.Exists(context.Background(), "signalled").Val() != 1 {
			t.Fatal("the lock is not held while the command runs")
		}
		if err := c.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if code := c.code(t); code != 3 {
			t.Fatalf("%v: exit %d, want the command's 3; stderr %q", sig, code, c.errOut)
		}
		waitMark(t, f, "got-"+strconv.Itoa(int(sig)))
		if admin.Exists(context.Background(), "signalled").Val() != 0 {
			t.Fatalf("%v: the lock was not released", sig)
		}
	}
}

// TestRunSignalledWhileWaiting: a signal that stops a command, sent while
// run waits for the lock, gives up the wait: exit 128+N, and the command
// never runs. (Black-box round 18: SIGQUIT gave a stack dump and exit 2.)
func TestRunSignalledWhileWaiting(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	if err := admin.Set(context.Background(), "waited-on", "someone", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	f := marksFile(t)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT} {
		c := newCLI(t, f, "run", "-addr", srv.Addr, "-wait", "30s", "waited-on", "--", "sh", "-c", `echo ran >> "$F"`)
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitSubscribers(t, admin, "{waited-on}:redislock:released", 1) // waiting
		if err := c.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if code := c.code(t); code != 128+int(sig) {
			t.Fatalf("%v: exit %d, want %d; stderr %q", sig, code, 128+int(sig), c.errOut)
		}
		waitSubscribers(t, admin, "{waited-on}:redislock:released", 0) // gone
	}
	if marks := readMarks(t, f); len(marks) != 0 {
		t.Fatalf("the command ran: %v", marks)
	}
	if v := admin.Get(context.Background(), "waited-on").Val(); v != "someone" {
		t.Fatalf("the holder's key holds %q", v)
	}
}

// waitSubscribers waits until channel has n subscribers.
func waitSubscribers(t *testing.T, c *redis.Client, channel string, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); c.PubSubNumSub(context.Background(), channel).Val()[channel] != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%s has not %d subscribers", channel, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunPassesASignalOnce: one SIGTERM reaches the command once, even when
// its graceful shutdown takes longer than go-zero's 5.5 s. (Issue 17,
// defect 2: go-zero's core/proc, linked in through core/metric, re-sent the
// signal to the process 5.5 s later, and run passed it on again.)
func TestRunPassesASignalOnce(t *testing.T) {
	srv := redisserver.Start(t)
	f := marksFile(t)
	c := newCLI(t, f, "run", "-addr", srv.Addr, "slow-shutdown", "--", "sh", "-c",
		`trap 'echo got >> "$F"; sleep 7; exit 3' TERM; echo started >> "$F"; while :; do sleep 0.1; done`)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitMark(t, f, "started")
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := c.code(t); code != 3 {
		t.Fatalf("exit %d, want the command's 3; stderr %q", code, c.errOut)
	}
	if marks := readMarks(t, f); len(marks) != 2 {
		t.Fatalf("marks %v: the command got the signal %d times", marks, len(marks)-1)
	}
	if strings.Contains(c.errOut.String(), "shutting down") {
		t.Fatalf("go-zero's signal handler ran: %q", c.errOut)
	}
}

// TestRunOnAKeyThatIsNotALock: a key of another type is no lock that a
// release will free: run exits 65, as status does, not 75. (Issue 17,
// defect 4: it exited 75, which the help did not list for it.)
func TestRunOnAKeyThatIsNotALock(t *testing.T) {
	srv := redisserver.Start(t)
	if err := srv.Client(t).HSet(context.Background(), "a-hash", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	c := newCLI(t, marksFile(t), "run", "-addr", srv.Addr, "a-hash", "--", "true")
	if code := c.code(t); code != 65 {
		t.Fatalf("exit %d, want 65; stderr %q", code, c.errOut)
	}
	if !strings.Contains(c.errOut.String(), "not a lock") {
		t.Fatalf("stderr %q", c.errOut)
	}
}

func TestRunFencingTokenAndStatus(t *testing.T) {
	srv := redisserver.Start(t)
	f := marksFile(t)
	var out lockedBuffer
	if code := run([]string{"status", "-addr", srv.Addr, "report"}, &out, &out); code != 0 || out.String() != "report: free\n" {
		t.Fatalf("status of a free key: %d %q", code, out.String())
	}
	c := newCLI(t, f, "run", "-addr", srv.Addr, "-fencing", "report", "--", "sh", "-c",
		`echo token-$REDISLOCK_TOKEN >> "$F"; echo started >> "$F"; sleep 0.5`)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitMark(t, f, "started")
	out.Reset()
	if code := run([]string{"status", "-addr", srv.Addr, "report"}, &out, &out); code != 0 ||
		!strings.HasPrefix(out.String(), "report: held by ") || !strings.Contains(out.String(), " left; fencing counter ") {
		t.Fatalf("status of a held key: %d %q", code, out.String())
	}
	if code := c.code(t); code != 0 {
		t.Fatalf("exit %d; stderr %q", code, c.errOut)
	}
	token, err := strconv.ParseInt(strings.TrimPrefix(readMarks(t, f)[0], "token-"), 10, 64)
	if err != nil || token <= 0 {
		t.Fatalf("REDISLOCK_TOKEN: %v, %v", readMarks(t, f), err)
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use: the library logs
// from the background (the give-back of an acquisition that failed
// ambiguously), also after a command returned.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}

func TestRunUsageAndMissingCommand(t *testing.T) {
	srv := redisserver.Start(t)
	if err := srv.Client(t).Set(context.Background(), "{kc}:redislock:fence", "abc", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"run", "-addr", srv.Addr, "-ttl", "0", "k", "--", "true"}, exitUsage},
		{[]string{"run", "-addr", srv.Addr}, exitUsage},
		{[]string{"run", "-addr", srv.Addr, "k"}, exitUsage},
		{[]string{"run", "-addr", srv.Addr, "-ttl", "-1s", "k", "--", "true"}, exitUsage},
		{[]string{"run", "-addr", srv.Addr, "-max-hold", "-1s", "k", "--", "true"}, exitUsage}, // issue 8, bug 10
		{[]string{"run", "-addr", srv.Addr, "-wait", "-1s", "k", "--", "true"}, exitUsage},
		{[]string{"run", "-addr", srv.Addr, "-grace", "-1s", "k", "--", "true"}, exitUsage},
		{[]string{"run", "-addr", srv.Addr, "", "--", "true"}, exitUsage},
		{[]string{"run", "-addr", srv.Addr, "{k}:redislock:fence", "--", "true"}, exitUsage}, // a reserved key
		{[]string{"status", "-addr", srv.Addr, "{k}:redislock:fence"}, exitUsage},
		{[]string{"run", "-addr", srv.Addr, "k", "-ttl", "1s", "--", "true"}, exitUsage},   // flags after KEY (round 18: ran "-ttl", 127)
		{[]string{"run", "-addr", srv.Addr, "-fencing", "kc", "--", "true"}, exitNotALock}, // a corrupt counter (round 18: 69)
		{[]string{"run", "-addr", srv.Addr, "k", "--", "no-such-command-here"}, exitNotFound},
		{[]string{"run", "-addr", "127.0.0.1:1", "k", "--", "true"}, exitUnavailable},
		{[]string{"run", "-addr", srv.Addr, "k", "--", "sh", "-c", "exit 7"}, 7},
		{[]string{"status", "-addr", "127.0.0.1:1", "k"}, exitUnavailable},
		{[]string{"status"}, exitUsage},
		{[]string{"status", "-addr", srv.Addr, "-cluster", srv.Addr, "k"}, exitUsage}, // round 18: 69
		{[]string{"run", "-addr", srv.Addr, "-cluster", srv.Addr, "k", "--", "true"}, exitUsage},
	} {
		out.Reset()
		if code := run(tc.args, &out, &out); code != tc.want {
			t.Errorf("%v: exit %d, want %d: %s", tc.args, code, tc.want, out.String())
		}
		if strings.Contains(out.String(), "redislock: redislock:") { // found by the black-box review
			t.Errorf("%v: the prefix twice: %s", tc.args, out.String())
		}
	}
	if n := srv.Client(t).Exists(context.Background(), "k").Val(); n != 0 {
		t.Fatal("a run left its lock behind")
	}
}

// Issue 8, bug 9: "-wait D" on a free lock exited 75 for waits up to about
// 1ms (no attempt was made before the subscription was confirmed), and
// sometimes 70 when the wait's deadline met the acquisition (the give-up
// timer cancelled the context that bound the new hold).
func TestRunShortWaitOnFreeLock(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	var out lockedBuffer
	for i, wait := range []string{"1ns", "1us", "100us", "1ms", "2ms", "5ms", "1ms", "1ns"} {
		out.Reset()
		key := "free-" + strconv.Itoa(i)
		if code := run([]string{"run", "-addr", srv.Addr, "-wait", wait, "-ttl", "300ms", key, "--", "sh", "-c", "sleep 0.5"}, &out, &out); code != 0 {
			t.Errorf("-wait %s on a free lock: exit %d: %s", wait, code, out.String())
		}
		if n := admin.Exists(context.Background(), key).Val(); n != 0 {
			t.Errorf("-wait %s: the lock was left behind", wait)
		}
	}
}

// A wait that ends with the lock does not bound the hold: a command that
// runs for many leases after a short -wait keeps its lock (the old give-up
// timer's Stop result was ignored).
func TestRunWaitDoesNotBoundTheHold(t *testing.T) {
	srv := redisserver.Start(t)
	holder := redislock.NewRedisLock(redislock.FromGoRedis(srv.Client(t)), "handed")
	if ok, err := holder.Acquire(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	go func() { time.Sleep(100 * time.Millisecond); holder.Release() }()
	var out lockedBuffer
	if code := run([]string{"run", "-addr", srv.Addr, "-wait", "300ms", "-ttl", "150ms", "handed", "--", "sh", "-c", "sleep 1"}, &out, &out); code != 0 {
		t.Fatalf("exit %d, want 0: %s", code, out.String())
	}
}

// Issue 25: "run" against a replica (a primary demoted by a failover) ran
// the command while another owner held the lock: the refused SET was
// taken for an acquisition. It exits 69 without running the command.
func TestRunOnAReplicaRunsNothing(t *testing.T) {
	ctx := context.Background()
	primary := redisserver.Start(t)
	if err := primary.Client(t).Set(ctx, "nightly", "someone", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	for replica.Client(t).Get(ctx, "nightly").Val() != "someone" {
		time.Sleep(20 * time.Millisecond)
	}
	ran := filepath.Join(t.TempDir(), "ran")
	var out lockedBuffer
	for _, key := range []string{"nightly", "free"} {
		out.Reset()
		code := run([]string{"run", "-addr", replica.Addr, "-wait", "0", key, "--", "touch", ran}, &out, &out)
		if code != exitUnavailable || !strings.Contains(out.String(), "READONLY") {
			t.Errorf("run on a replica, %s key: exit %d, want %d with READONLY: %s", key, code, exitUnavailable, out.String())
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatalf("run on a replica, %s key: the command ran", key)
		}
	}
}

// TestRunPermitsAndShared: 5 runs of a 2-permit semaphore, never more than
// 2 inside; a shared run beside a shared holder, none beside an exclusive
// one; status lists the holders; mistakes exit 64 and 65.
func TestRunPermitsAndShared(t *testing.T) {
	srv := redisserver.Start(t)
	f := marksFile(t)
	script := `echo in >> "$F"; sleep 0.2; echo out >> "$F"`
	var wg sync.WaitGroup
	codes := make([]int, 5)
	for i := range codes {
		c := newCLI(t, f, "run", "-addr", srv.Addr, "-wait", "30s", "-permits", "2", "exports", "--", "sh", "-c", script)
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = c.code(t) }()
	}
	wg.Wait()
	inside, most := 0, 0
	for _, m := range readMarks(t, f) {
		if m == "in" {
			inside++
		} else {
			inside--
		}
		most = max(most, inside)
	}
	if most != 2 || slices.ContainsFunc(codes, func(c int) bool { return c != 0 }) {
		t.Fatalf("at most %d inside of 2 permits; exits %v", most, codes)
	}

	client := redislock.FromGoRedis(srv.Client(t))
	reader := redislock.NewRedisLock(client, "catalogue", redislock.WithShared())
	if ok, err := reader.Acquire(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if c := newCLI(t, f, "run", "-addr", srv.Addr, "-shared", "catalogue", "--", "true"); c.code(t) != 0 {
		t.Fatalf("a shared run beside a share: %s", c.errOut)
	}
	if c := newCLI(t, f, "run", "-addr", srv.Addr, "catalogue", "--", "true"); c.code(t) != exitBusy {
		t.Fatalf("an exclusive run beside a share: %s", c.errOut)
	}
	var out, errOut lockedBuffer
	if code := run([]string{"status", "-addr", srv.Addr, "catalogue"}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "catalogue: shared by 1: "+reader.Owner()+" ") {
		t.Fatalf("status: exit %d, %q %q", code, out.String(), errOut.String())
	}
	if ok, err := reader.Release(); !ok || err != nil {
		t.Fatal(ok, err)
	}

	holder := redislock.NewRedisLock(client, "exports", redislock.WithPermits(2))
	if ok, err := holder.Acquire(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer holder.Release()
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"-permits", "3", "exports"}, exitNotALock},
		{[]string{"exports"}, exitNotALock},
		{[]string{"-permits", "-1", "exports"}, exitUsage},
		{[]string{"-permits", "2", "-shared", "exports"}, exitUsage},
	} {
		args := append(append([]string{"run", "-addr", srv.Addr}, tc.args...), "--", "true")
		if c := newCLI(t, f, args...); c.code(t) != tc.want {
			t.Fatalf("%v: want exit %d; stderr %q", tc.args, tc.want, c.errOut)
		}
	}
	var js lockedBuffer
	if code := run([]string{"status", "-addr", srv.Addr, "-json", "exports"}, &js, &errOut); code != 0 {
		t.Fatalf("status -json: exit %d", code)
	}
	if v := decodeStatus(t, js.String()); v.Permits != 2 || len(v.Holders) != 1 || v.Holders[0].Owner != holder.Owner() || v.Holders[0].TTLms <= 0 {
		t.Fatalf("status -json: %+v", v)
	}
}

// TestRunReplicas: -replicas 1 runs the command once the replica has the
// lock (REDISLOCK_OWNER is the key's value on the replica, read by the
// command itself), and nothing while the replica is paused (exit 69);
// -replicas 2 with one replica runs nothing and exits 69; -replicas -1 is
// a usage error.
func TestRunReplicas(t *testing.T) {
	primary := redisserver.Start(t)
	replica := redisserver.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	primary.WaitReplicas(t, 1)
	cli := redisserver.Binary(t, "redis-cli")
	seen := filepath.Join(t.TempDir(), "seen")
	var out lockedBuffer
	script := cli + ` -p ` + strconv.Itoa(replica.Port) + ` GET nightly > ` + seen + `; echo "$REDISLOCK_OWNER" >> ` + seen
	if code := run([]string{"run", "-addr", primary.Addr, "-replicas", "1", "nightly", "--", "sh", "-c", script}, &out, &out); code != 0 {
		t.Fatalf("-replicas 1: exit %d: %s", code, out.String())
	}
	b, err := os.ReadFile(seen)
	if lines := strings.Fields(string(b)); err != nil || len(lines) != 2 || lines[0] != lines[1] {
		t.Fatalf("the replica had %q while the command ran: %v", b, err)
	}
	ran := filepath.Join(t.TempDir(), "ran")
	replica.Signal(t, syscall.SIGSTOP)
	code := run([]string{"run", "-addr", primary.Addr, "-replicas", "1", "-ttl", "2s", "nightly", "--", "touch", ran}, &out, &out)
	replica.Signal(t, syscall.SIGCONT)
	if code != exitUnavailable || !strings.Contains(out.String(), "not replicated") {
		t.Errorf("-replicas 1, the replica paused: exit %d: %s", code, out.String())
	}
	for args, want := range map[string]int{"2": exitUnavailable, "-1": exitUsage} {
		out.Reset()
		if code := run([]string{"run", "-addr", primary.Addr, "-replicas", args, "nightly", "--", "touch", ran}, &out, &out); code != want {
			t.Errorf("-replicas %s: exit %d, want %d: %s", args, code, want, out.String())
		}
	}
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("a command ran without its replicas")
	}
}
