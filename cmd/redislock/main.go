// Command redislock works with redislock's distributed locks on Redis.
//
//	redislock run [flags] KEY -- COMMAND [ARGS...]
//	redislock status [flags] KEY
//	redislock demo [-addr host:port]
//
// run holds KEY while COMMAND runs (under Do), like flock across machines: see
// "redislock run -h" for its flags and exit statuses. status tells whether
// KEY is held, for how long still, and by which owner id.
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
	"os"

	"github.com/redis/go-redis/v9"
	"github.com/zeromicro/go-zero/core/logx"
)

const usage = `usage: redislock <command> [flags]

commands:
  run     run a command while holding a lock: redislock run [flags] KEY -- COMMAND [ARGS...]
  status  whether a lock is held, for how long, and by whom: redislock status [flags] KEY
  demo    a narrated tour of the lock, on an embedded Redis or on -addr
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
	case "run":
		// stdout is the command's: the library's logs, whatever their
		// level, go to stderr, and go-redis's through them.
		logx.SetWriter(logx.NewWriter(stderr))
		redis.SetLogger(logxLogger{})
		return runCmd(args[1:], stderr)
	case "status":
		logx.SetWriter(logx.NewWriter(stderr))
		redis.SetLogger(logxLogger{})
		return statusCmd(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "redislock: unknown command %q\n%s", args[0], usage)
	return exitUsage
}

// logxLogger sends go-redis's own log lines (connection pool retries and
// the like) through logx, as errors: they say Redis is hard to reach.
type logxLogger struct{}

func (logxLogger) Printf(ctx context.Context, format string, v ...any) {
	logx.WithContext(ctx).Errorf(format, v...) // go-redis says "redis:" itself
}
