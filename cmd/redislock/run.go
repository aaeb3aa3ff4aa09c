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
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redislock/redislock"
)

// Exit statuses of run and status, besides the command's own.
const (
	exitUsage       = 64 // bad flags or arguments (EX_USAGE)
	exitUnavailable = 69 // Redis cannot be reached, or answered an error (EX_UNAVAILABLE)
	exitLost        = 70 // the lock was lost while the command ran; it was stopped
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
  64  usage          69  Redis unavailable       70  lock lost while COMMAND ran
  75  lock busy      126 COMMAND not executable  127 COMMAND not found
  128+N  COMMAND was killed by signal N
If the lock is lost while COMMAND runs, COMMAND gets SIGTERM, then SIGKILL
after -grace. SIGINT and SIGTERM to redislock are passed on to COMMAND.

flags:
`

// runCmd is "redislock run".
func runCmd(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, runUsage); fs.PrintDefaults() }
	var conn connFlags
	conn.register(fs)
	ttl := fs.Duration("ttl", redislock.DefaultExpiry, "the lease; renewed every ttl/3 while COMMAND runs")
	maxHold := fs.Duration("max-hold", 0, "stop COMMAND and release the lock after this long (0: no limit)")
	wait := fs.Duration("wait", 0, "how long to wait for a busy lock (0: exit 75 at once, like flock -n)")
	fencing := fs.Bool("fencing", false, "pass a fencing token to COMMAND as $REDISLOCK_TOKEN")
	grace := fs.Duration("grace", 10*time.Second, "after a lost lock, how long COMMAND has between SIGTERM and SIGKILL")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) >= 2 && rest[1] == "--" {
		rest = append(rest[:1], rest[2:]...)
	}
	if len(rest) < 2 {
		fs.Usage()
		return exitUsage
	}
	key, command := rest[0], rest[1:]

	client, err := conn.client()
	if err != nil {
		fmt.Fprintf(stderr, "redislock: %v\n", err)
		return exitUsage
	}
	defer client.Close()
	opts := []redislock.Option{redislock.WithExpiry(*ttl)}
	if *maxHold > 0 {
		opts = append(opts, redislock.WithMaxHold(*maxHold))
	}
	if *fencing {
		opts = append(opts, redislock.WithFencing())
	}
	lock := redislock.NewRedisLock(redislock.FromGoRedis(client), key, opts...)

	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)

	if code, ok := acquire(lock, *wait, signals, stderr); !ok {
		return code
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := lock.ReleaseCtx(ctx); err != nil && !errors.Is(err, redislock.ErrLockLost) && !errors.Is(err, redislock.ErrMaxHoldExceeded) {
			fmt.Fprintf(stderr, "redislock: releasing %q: %v (it expires with its lease)\n", key, err)
		}
	}()

	child := exec.Command(command[0], command[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.Env = os.Environ()
	if *fencing {
		child.Env = append(child.Env, "REDISLOCK_TOKEN="+strconv.FormatInt(lock.Token(), 10))
	}
	if err := child.Start(); err != nil {
		fmt.Fprintf(stderr, "redislock: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotExec
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	for {
		select {
		case err := <-exited:
			return exitStatus(err)
		case sig := <-signals:
			_ = child.Process.Signal(sig) // the command decides; we release when it exits
		case <-lock.Done():
			fmt.Fprintf(stderr, "redislock: %v; stopping %s\n", lock.Err(), command[0])
			_ = child.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(*grace):
				fmt.Fprintf(stderr, "redislock: %s still runs %v after SIGTERM; killing it\n", command[0], *grace)
				_ = child.Process.Kill()
				<-exited
			}
			return exitLost
		}
	}
}

// acquire takes the lock, waiting up to wait. It reports the exit status
// and false when the command must not run.
func acquire(lock *redislock.RedisLock, wait time.Duration, signals <-chan os.Signal, stderr io.Writer) (int, bool) {
	if wait <= 0 {
		ok, err := lock.Acquire()
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "redislock: %v\n", err)
			return unavailableOrUsage(err), false
		case !ok:
			fmt.Fprintf(stderr, "redislock: %q is held by another owner\n", lock.Key())
			return exitBusy, false
		}
		return 0, true
	}
	// ctx binds the hold as well as the wait: stop the timer that ends the
	// wait as soon as the lock is ours, and cancel ctx only on the way out.
	ctx, cancel := context.WithCancel(context.Background())
	giveUp := time.AfterFunc(wait, cancel)
	got := make(chan error, 1)
	go func() { got <- lock.AcquireWait(ctx) }()
	for {
		select {
		case err := <-got:
			giveUp.Stop()
			switch {
			case errors.Is(err, redislock.ErrNotAcquired):
				cancel()
				fmt.Fprintf(stderr, "redislock: %q still held by another owner after %v\n", lock.Key(), wait)
				return exitBusy, false
			case err != nil:
				cancel()
				fmt.Fprintf(stderr, "redislock: %v\n", err)
				return unavailableOrUsage(err), false
			}
			return 0, true
		case sig := <-signals:
			cancel()
			<-got
			fmt.Fprintf(stderr, "redislock: %v while waiting for %q\n", sig, lock.Key())
			return 128 + int(sig.(syscall.Signal)), false
		}
	}
}

func unavailableOrUsage(err error) int {
	for _, bad := range []error{redislock.ErrEmptyKey, redislock.ErrKeyTooLong, redislock.ErrInvalidExpiry} {
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

// statusCmd is "redislock status KEY": whether KEY is held, for how long
// still, and by which owner id.
func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var conn connFlags
	conn.register(fs)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: redislock status [flags] KEY")
		return exitUsage
	}
	key := fs.Arg(0)
	client, err := conn.client()
	if err != nil {
		fmt.Fprintf(stderr, "redislock: %v\n", err)
		return exitUsage
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	owner, err := client.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		fmt.Fprintf(stdout, "%s: free\n", key)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "redislock: %v\n", err)
		return exitUnavailable
	}
	ttl, err := client.PTTL(ctx, key).Result()
	if err != nil {
		fmt.Fprintf(stderr, "redislock: %v\n", err)
		return exitUnavailable
	}
	left := "no expiry"
	if ttl >= 0 {
		left = ttl.String() + " left"
	}
	fmt.Fprintf(stdout, "%s: held by %s, %s\n", key, owner, left)
	return 0
}
