package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/redislock/redislock"
)

const electUsage = `usage: redislock elect [flags] KEY -- COMMAND [ARGS...]

Campaigns in the election KEY, runs COMMAND once this process leads, and
resigns when COMMAND exits: the next candidate, waiting in its own
"redislock elect", is elected then. Candidates are elected in arrival
order, and wait as long as it takes (or -wait). COMMAND finds its term, a
fencing token, in $REDISLOCK_TERM. Exit statuses, signals and the loss of
the leadership (SIGTERM to COMMAND, exit 70) are as for "redislock run";
75: not elected within -wait.

flags:
`

// electCmd is "redislock elect".
func electCmd(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("elect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, electUsage); fs.PrintDefaults() }
	var h holdFlags
	h.register(fs, "a term", "how long to wait to be elected (0: as long as it takes)")
	host, _ := os.Hostname()
	value := fs.String("value", host, "the leader's value, which \"redislock leader\" prints")
	opts, code, ok := h.parse(fs, args, stderr)
	if !ok {
		return code
	}
	defer h.client.Close()
	locker := redislock.NewLocker(redislock.FromGoRedis(h.client))
	defer locker.Close()
	e := locker.NewElection(h.key, opts...)
	r := &runner{lock: locker.NewLock(h.key, opts...), key: e.Key(), busy: "did not elect this process within -wait", command: h.command,
		grace: h.grace, stderr: stderr, env: func() []string { return []string{"REDISLOCK_TERM=" + strconv.FormatInt(e.Term(), 10)} }}
	r.do = func(ctx context.Context, fn func(context.Context) error) error {
		if r.notALock() { // never released: say so now (as run does), not after -wait
			return fmt.Errorf("%w: %q is not an election's key", redislock.ErrNotAcquired, e.Key())
		}
		return lead(ctx, e, *value, fn)
	}
	return r.run()
}

// lead runs fn once e is elected with value, under a context that ends
// with the term (its cause why), then resigns. It returns Campaign's error,
// or why the term ended while fn ran, or Resign's.
func lead(ctx context.Context, e *redislock.Election, value string, fn func(context.Context) error) error {
	if err := e.Campaign(ctx, value); err != nil {
		return err
	}
	term, end := context.WithCancelCause(context.WithoutCancel(ctx))
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		select {
		case <-e.Done():
			end(e.Err())
		case <-term.Done():
		}
	}()
	err := fn(term)
	end(nil)
	<-ended
	if lost := e.Err(); lost != nil {
		return lost
	}
	return errors.Join(err, e.Resign(context.WithoutCancel(ctx)))
}

const leaderUsage = `usage: redislock leader [-watch] [flags] KEY

Prints the value of the leader of the election KEY (quoted, in Go's
syntax, when it holds a newline or another control character). Exits 75
when nobody leads (or the leader has not published its value yet). With
-watch, prints the value, then each change, until interrupted: an empty
line while nobody leads.

flags:
`

// leaderCmd is "redislock leader".
func leaderCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, leaderUsage); fs.PrintDefaults() }
	var conn connFlags
	conn.register(fs)
	watch := fs.Bool("watch", false, "print each change until interrupted")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return exitUsage
	}
	client, err := conn.client()
	if err != nil {
		complain(stderr, err)
		return exitUsage
	}
	defer client.Close()
	locker := redislock.NewLocker(redislock.FromGoRedis(client))
	defer locker.Close()
	e := locker.NewElection(fs.Arg(0))
	if *watch {
		for value := range e.Observe(ctx) {
			fmt.Fprintln(stdout, shown(value))
		}
		return 0
	}
	value, err := e.Leader(ctx)
	switch {
	case errors.Is(err, redislock.ErrNoLeader):
		fmt.Fprintf(stderr, "redislock: %q: no leader\n", e.Key())
		return exitBusy
	case err != nil:
		complain(stderr, err)
		return unavailableOrUsage(err)
	}
	fmt.Fprintln(stdout, shown(value))
	return 0
}

// shown is a leader's value as "leader" prints it: as it is, but quoted
// when it holds a control character, so that a value is always one line.
func shown(value string) string {
	if value == "" {
		return ""
	}
	return text(value)
}
