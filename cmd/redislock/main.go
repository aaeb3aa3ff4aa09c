// Command redislock works with redislock's distributed locks on Redis.
//
//	redislock run [flags] KEY -- COMMAND [ARGS...]
//	redislock elect [flags] KEY -- COMMAND [ARGS...]
//	redislock leader [-watch] [flags] KEY
//	redislock status [-json] [flags] KEY
//	redislock break [-owner ID] [-json] [flags] KEY
//	redislock watch [-poll D] [-json] [flags] KEY
//	redislock demo [-addr host:port]
//
// run holds KEY while COMMAND runs (under Do), like flock across machines: see
// "redislock run -h" for its flags and exit statuses. status tells whether
// KEY is held, by which owner id, for how long still, its fencing counter
// and its fair-lock waiters. break deletes a stuck lock on purpose (only
// a given owner's with -owner) and wakes its waiters; its holder learns of
// the loss at its next renewal. watch prints each change of holder and lease
// until interrupted.
//
// demo shows what the library does, narrated, in about 20 seconds: workers
// contending for one lock, a nested re-entry, a long job kept alive by the
// watchdog, a lost lease reported to its holder, the maximum hold, and a
// shutdown under Do beside a request context that stops the renewal. With
// -addr it uses that Redis (keys under "redislock-demo:"); without, an
// embedded miniredis whose clock follows real time.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
)

const usage = `usage: redislock <command> [flags]

commands:
  run     run a command while holding a lock: redislock run [flags] KEY -- COMMAND [ARGS...]
  elect   run a command while this process leads an election: redislock elect [-value V] KEY -- COMMAND [ARGS...]
  leader  print an election's leader: redislock leader [-watch] KEY
  status  whether a lock is held, by whom, for how long: redislock status [-json] KEY
  break   delete a stuck lock and wake its waiters: redislock break [-owner ID] [-json] KEY
  watch   print each change of a lock's holder and lease: redislock watch [-poll D] [-json] KEY
  demo    a narrated tour of the lock, on an embedded Redis or on -addr

Redis: -addr host:port, -cluster host:port,..., or $REDIS_URL; else 127.0.0.1:6379.
"redislock COMMAND -h" describes each command's flags.

exit statuses:
  0    done (status: held or free; break: broken or free; watch: interrupted; -h)
  1    demo failed
  64   usage: bad flags or arguments
  65   the key holds something that is not a lock (run, status, break, watch),
       or its fencing counter something that is not a number (run -fencing,
       status, watch)
  69   Redis unavailable, or it answered an error
  70   run: the lock was lost, or -max-hold passed, while COMMAND ran; COMMAND was stopped (or had exited);
       elect: the same of the leadership
  75   run: the lock was busy for all of -wait; break: held by another owner than -owner;
       elect: not elected within -wait; leader: nobody leads
  126  run: COMMAND not executable     127  run: COMMAND not found
  128+N  run: COMMAND was killed by signal N; or a signal N ended the wait
  run otherwise exits with COMMAND's own status.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "demo":
		return demo(args[1:], stdout, stderr)
	case "run", "elect":
		// stdout is the command's: the library's logs go to stderr, and
		// go-redis's through them.
		logTo(stderr)
		if args[0] == "elect" {
			return electCmd(args[1:], stderr)
		}
		return runCmd(args[1:], stderr)
	case "status", "break", "watch", "leader":
		logTo(stderr)
		switch args[0] {
		case "status":
			return statusCmd(args[1:], stdout, stderr)
		case "break":
			return breakCmd(args[1:], stdout, stderr)
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if args[0] == "leader" {
			return leaderCmd(ctx, args[1:], stdout, stderr)
		}
		return watchCmd(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "redislock: unknown command %q\n%s", args[0], usage)
	return exitUsage
}

// logTo sends the library's lines (slog.Default's, at Info and above) to
// w as text, go-redis's own through them, and go-zero's (its signal
// handler's, say) there too.
func logTo(w io.Writer) {
	log := slog.New(slog.NewTextHandler(w, nil))
	slog.SetDefault(log)
	redis.SetLogger(redisLogger{log})
	logx.SetWriter(logx.NewWriter(w))
}

// redisLogger logs go-redis's own lines (connection pool retries and the
// like) as warnings: they say Redis is hard to reach.
type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, fmt.Sprintf(format, v...)) // go-redis says "redis:" itself
}
