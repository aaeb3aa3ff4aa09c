package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// Exit statuses of run and status, besides the command's own.
const (
	exitUsage       = 64 // bad flags or arguments (EX_USAGE)
	exitUnavailable = 69 // Redis cannot be reached, or answered an error (EX_UNAVAILABLE)
	exitLost        = 70 // the lock was lost (or -max-hold passed) while the command ran; it was stopped
	exitBusy        = 75 // the lock was held by another owner for all of -wait (EX_TEMPFAIL)
	exitCannotExec  = 126
	exitNotFound    = 127
)

// connFlags are the flags that say which Redis to use.
type connFlags struct {
	addr, cluster string
}

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "", "Redis address host:port (default: $REDIS_URL, a redis:// or rediss:// URL, else 127.0.0.1:6379)")
	fs.StringVar(&c.cluster, "cluster", "", "comma-separated Redis Cluster node addresses, instead of -addr")
}

// client returns the go-redis client the flags name.
func (c *connFlags) client() (redis.UniversalClient, error) {
	switch {
	case c.cluster != "" && c.addr != "":
		return nil, errors.New("-addr and -cluster: give one")
	case c.cluster != "":
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(c.cluster, ",")}), nil
	case c.addr != "":
		return redis.NewClient(&redis.Options{Addr: c.addr}), nil
	case os.Getenv("REDIS_URL") != "":
		opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		return redis.NewClient(opt), nil
	}
	return redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}), nil
}

const runUsage = `usage: redislock run [flags] KEY -- COMMAND [ARGS...]

Runs COMMAND while holding the lock KEY, renewed in the background, and
releases it when COMMAND exits. Exits with COMMAND's status, or:
  64  usage          65  KEY, or its fencing counter, holds something else
                         (or another kind of lock: see -permits, -shared)
  69  Redis unavailable (or, with -replicas, its replicas)
  70  lock lost (or -max-hold passed) while COMMAND ran   75  lock busy
  126 COMMAND not executable                      127 COMMAND not found
  128+N  COMMAND was killed by signal N
If the lock is lost while COMMAND runs (its key expired, or was deleted by
"redislock break"), or -max-hold passes, COMMAND gets SIGTERM, then SIGKILL
after -grace; if COMMAND exited before the loss was known (the release
found the key gone or taken), redislock exits 70 all the same. SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to redislock are passed on to
COMMAND (to it alone, not to its children); the first four, while waiting,
give up the wait. COMMAND finds the lock's
owner id in $REDISLOCK_OWNER (what "redislock status" shows and
"redislock break -owner" takes) and, with -fencing, its token in
$REDISLOCK_TOKEN.

flags:
`

// holdFlags are the flags of a command run under a hold (run, elect).
type holdFlags struct {
	conn               connFlags
	ttl, maxHold, wait time.Duration
	grace              time.Duration
	replicas           int
	key                string
	command            []string
	client             redis.UniversalClient // made by parse; the caller closes it
}

// register adds the flags to fs; what names the hold in their help.
func (h *holdFlags) register(fs *flag.FlagSet, what, waitHelp string) {
	h.conn.register(fs)
	fs.DurationVar(&h.ttl, "ttl", redislock.DefaultExpiry, "the lease of "+what+"; renewed every ttl/3 while COMMAND runs")
	fs.DurationVar(&h.maxHold, "max-hold", 0, "stop COMMAND and give up "+what+" after this long (0: no limit)")
	fs.DurationVar(&h.wait, "wait", 0, waitHelp)
	fs.DurationVar(&h.grace, "grace", 10*time.Second, "after "+what+" is lost, how long COMMAND has between SIGTERM and SIGKILL")
	fs.IntVar(&h.replicas, "replicas", 0, "take and renew "+what+" only once N replicas acknowledged it (WAIT), to survive a failover")
}

// parse parses args, checks them, makes the client, and returns the
// options they give; not ok with the exit status when the command is not
// to run (-h, bad flags).
func (h *holdFlags) parse(fs *flag.FlagSet, args []string, stderr io.Writer) ([]redislock.Option, int, bool) {
	if err := fs.Parse(args); err != nil {
		return nil, parseStatus(err), false
	}
	for name, d := range map[string]time.Duration{"max-hold": h.maxHold, "wait": h.wait, "grace": h.grace} {
		if d < 0 {
			fmt.Fprintf(stderr, "redislock: -%s %v: must not be negative\n", name, d)
			return nil, exitUsage, false
		}
	}
	var ok bool
	if h.key, h.command, ok = keyAndCommand(fs, stderr); !ok {
		return nil, exitUsage, false
	}
	var err error
	if h.client, err = h.conn.client(); err != nil {
		complain(stderr, err)
		return nil, exitUsage, false
	}
	opts := []redislock.Option{redislock.WithExpiry(h.ttl)}
	if h.maxHold > 0 {
		opts = append(opts, redislock.WithMaxHold(h.maxHold))
	}
	if h.replicas != 0 {
		opts = append(opts, redislock.WithReplicas(h.replicas))
	}
	if h.wait > 0 {
		opts = append(opts, redislock.WithWaitTimeout(h.wait))
	}
	return opts, 0, true
}

// runCmd is "redislock run".
func runCmd(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, runUsage); fs.PrintDefaults() }
	var h holdFlags
	h.register(fs, "the lock", "how long to wait for a busy lock (0: exit 75 at once, like flock -n)")
	fencing := fs.Bool("fencing", false, "pass a fencing token to COMMAND as $REDISLOCK_TOKEN")
	permits := fs.Int("permits", 0, "hold one of N permits of KEY, a semaphore (0: a lock)")
	shared := fs.Bool("shared", false, "hold KEY shared with other -shared holders, excluding the others")
	opts, code, ok := h.parse(fs, args, stderr)
	if !ok {
		return code
	}
	defer h.client.Close()
	if *fencing {
		opts = append(opts, redislock.WithFencing())
	}
	if *permits != 0 {
		opts = append(opts, redislock.WithPermits(*permits))
	}
	if *shared {
		opts = append(opts, redislock.WithShared())
	}
	if h.wait == 0 {
		opts = append(opts, redislock.WithRetry(redislock.LimitRetry(redislock.DefaultRetry, 1))) // one attempt
	}
	// A Locker of its own, closed before the client: Close waits for what
	// runs in the background (a give-back of an attempt cut short).
	locker := redislock.NewLocker(redislock.FromGoRedis(h.client))
	defer locker.Close()
	lock := locker.NewLock(h.key, opts...)
	env := func() []string {
		env := []string{"REDISLOCK_OWNER=" + lock.Owner()}
		if *fencing {
			env = append(env, "REDISLOCK_TOKEN="+strconv.FormatInt(lock.Token(), 10))
		}
		return env
	}
	r := &runner{lock: lock, key: lock.Key(), do: lock.Do, env: env, busy: "is held by another owner",
		command: h.command, grace: h.grace, stderr: stderr}
	return r.run()
}

// keyAndCommand returns the KEY -- COMMAND [ARGS...] after fs's flags;
// not ok (usage printed) when they are not there.
func keyAndCommand(fs *flag.FlagSet, stderr io.Writer) (key string, command []string, ok bool) {
	if rest := fs.Args(); len(rest) > 0 {
		key, command = rest[0], rest[1:]
	}
	switch {
	case len(command) > 0 && command[0] == "--":
		command = command[1:]
	case len(command) > 0 && strings.HasPrefix(command[0], "-"):
		fmt.Fprintf(stderr, "redislock: %s after KEY: flags go before it\n", command[0])
		return "", nil, false
	}
	if len(command) == 0 {
		fs.Usage()
		return "", nil, false
	}
	return key, command, true
}

// runner runs one command under a lock. A signal before the command starts
// gives up the wait; once it runs, signals are passed on to it.
type runner struct {
	lock    *redislock.RedisLock // run's; nil for elect
	key     string
	do      func(ctx context.Context, fn func(context.Context) error) error // holds key while fn runs
	env     func() []string                                                 // what COMMAND learns of its hold
	busy    string                                                          // why it gave up the wait
	command []string
	grace   time.Duration
	stderr  io.Writer

	mu     sync.Mutex
	child  *os.Process // set once the command runs
	signal os.Signal   // the signal that ended the wait
	code   int         // the exit status, once the command ran
}

func (r *runner) run() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signals := make(chan os.Signal, 4)
	// Every signal a command may be sent to stop, or to act on, is passed
	// on to it: we hold the lock until it exits. go-zero's core/proc,
	// linked in through core/metric, listens for some of them from its init
	// (it re-sends SIGTERM 5.5 s later, and dumps goroutines on SIGUSR1):
	// take them from it, so that the command gets each signal once.
	passedOn := []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}
	signal.Reset(passedOn...)
	signal.Notify(signals, passedOn...)
	forwarded := make(chan struct{})
	go func() {
		defer close(forwarded)
		for sig := range signals {
			r.mu.Lock()
			switch {
			case r.child != nil:
				_ = r.child.Signal(sig) // the command decides; we release when it exits
			case r.signal == nil && sig != syscall.SIGUSR1 && sig != syscall.SIGUSR2:
				r.signal = sig
				cancel() // stop waiting
			}
			r.mu.Unlock()
		}
	}()
	defer func() {
		signal.Stop(signals)
		close(signals)
		<-forwarded
	}()

	ran := false
	err := r.do(ctx, func(ctx context.Context) error {
		ran = true
		return r.runCommand(ctx)
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	key := r.key
	switch {
	case r.child == nil && r.signal != nil: // before the command could start
		fmt.Fprintf(r.stderr, "redislock: %v while waiting for %q\n", r.signal, key)
		return 128 + int(r.signal.(syscall.Signal))
	case !ran && errors.Is(err, redislock.ErrNotReplicated) && !errors.Is(err, errors.ErrUnsupported):
		complain(r.stderr, err) // the replicas did not acknowledge it, or too few are online
		return exitUnavailable
	case !ran && errors.Is(err, redislock.ErrNotAcquired):
		if r.notALock() {
			fmt.Fprintf(r.stderr, "redislock: %q holds something that is not a lock\n", key)
			return exitNotALock
		}
		fmt.Fprintf(r.stderr, "redislock: %q %s\n", key, r.busy)
		return exitBusy
	case !ran && (errors.Is(err, redislock.ErrCorruptFencingCounter) || errors.Is(err, redislock.ErrWrongKind)):
		complain(r.stderr, err)
		return exitNotALock
	case !ran && isEnd(err):
		complain(r.stderr, err)
		return exitLost
	case !ran:
		complain(r.stderr, err)
		return unavailableOrUsage(err)
	case r.code == exitCannotExec || r.code == exitNotFound:
	case isEnd(err) && r.code != exitLost:
		// The command exited before the hold's loss was known: the
		// release found the key gone or taken. It ran part of its time
		// without the lock.
		fmt.Fprintf(r.stderr, "redislock: %s while %s ran; it exited %d\n", unprefixed(err), r.command[0], r.code)
		return exitLost
	case err != nil && !isEnd(err):
		fmt.Fprintf(r.stderr, "redislock: releasing %q: %s (it expires with its lease)\n", key, unprefixed(err))
	}
	return r.code
}

// notALock reports whether the lock's key holds a value of another type,
// which no release will free.
func (r *runner) notALock() bool {
	if r.lock == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := r.lock.Inspect(ctx)
	return errors.Is(err, redislock.ErrWrongType)
}

// isEnd reports whether err says the hold ended before its release.
func isEnd(err error) bool {
	return errors.Is(err, redislock.ErrLockLost) || errors.Is(err, redislock.ErrMaxHoldExceeded)
}

// runCommand runs the command until it exits, or until ctx ends because the
// hold ended: then the command gets SIGTERM, and SIGKILL after the grace.
func (r *runner) runCommand(ctx context.Context) error {
	child := exec.Command(r.command[0], r.command[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.Env = append(os.Environ(), r.env()...)
	r.mu.Lock()
	if r.signal != nil { // signalled just as the lock was taken: do not start
		r.mu.Unlock()
		return nil
	}
	if err := child.Start(); err != nil {
		r.code = exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			r.code = exitNotFound
		}
		r.mu.Unlock()
		complain(r.stderr, err)
		return err
	}
	r.child = child.Process
	r.mu.Unlock()

	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	select {
	case err := <-exited:
		r.setCode(exitStatus(err))
		return nil
	case <-ctx.Done():
	}
	fmt.Fprintf(r.stderr, "redislock: %s; stopping %s\n", unprefixed(context.Cause(ctx)), r.command[0])
	_ = child.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(r.grace):
		fmt.Fprintf(r.stderr, "redislock: %s still runs %v after SIGTERM; killing it\n", r.command[0], r.grace)
		_ = child.Process.Kill()
		<-exited
	}
	r.setCode(exitLost)
	return nil
}

func (r *runner) setCode(code int) {
	r.mu.Lock()
	r.code = code
	r.mu.Unlock()
}

func unavailableOrUsage(err error) int {
	for _, bad := range []error{redislock.ErrEmptyKey, redislock.ErrKeyTooLong, redislock.ErrReservedKey, redislock.ErrInvalidExpiry,
		redislock.ErrInvalidPermits, redislock.ErrInvalidReplicas, redislock.ErrEmptyValue, errors.ErrUnsupported} {
		if errors.Is(err, bad) {
			return exitUsage
		}
	}
	return exitUnavailable
}

// exitStatus turns the command's end into our exit status.
func exitStatus(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return exitCannotExec
		}
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// complain prints err on stderr, saying "redislock:" once.
func complain(stderr io.Writer, err error) {
	fmt.Fprintf(stderr, "redislock: %s\n", unprefixed(err))
}

// unprefixed is err's message without the "redislock: " it may start with.
func unprefixed(err error) string {
	return strings.TrimPrefix(err.Error(), "redislock: ")
}
