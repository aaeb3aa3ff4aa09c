package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redislock/redislock"
)

// The operator's commands: status, break and watch. They need no hold.

// exitNotALock is the exit status for a key that holds something other
// than a lock, which status cannot read and break does not delete.
const exitNotALock = 65 // EX_DATAERR

// statusJSON is a Status as status -json, break -json and watch -json
// print it, one object per line.
type statusJSON struct {
	Time    string       `json:"time,omitempty"` // watch: when the change was seen
	Key     string       `json:"key"`
	Held    bool         `json:"held"`
	Owner   string       `json:"owner"`
	TTLms   int64        `json:"ttl_ms"`            // 0 when free, -1 when the key has no expiry
	Expires string       `json:"expires,omitempty"` // by the Redis server's clock, RFC 3339
	Fence   int64        `json:"fence"`
	Waiters int          `json:"waiters"`
	Permits int          `json:"permits,omitempty"` // a semaphore's
	Shared  bool         `json:"shared,omitempty"`
	Holders []holderJSON `json:"holders,omitempty"` // status: a semaphore's or a shared lock's
	Broken  *bool        `json:"broken,omitempty"`  // break: whether it broke the lock
}

type holderJSON struct {
	Owner string `json:"owner"`
	TTLms int64  `json:"ttl_ms"`
}

func toJSON(st redislock.Status) statusJSON {
	ms := st.TTL.Milliseconds()
	if st.TTL < 0 {
		ms = -1
	}
	v := statusJSON{Key: st.Key, Held: st.Held, Owner: st.Owner, TTLms: ms, Fence: st.Fence, Waiters: st.Waiters,
		Permits: st.Permits, Shared: st.Shared}
	if !st.Expires.IsZero() {
		v.Expires = st.Expires.UTC().Format(time.RFC3339Nano)
	}
	return v
}

// describe is a Status in one line of text.
func describe(st redislock.Status) string {
	var b strings.Builder
	switch {
	case st.Permits > 0:
		fmt.Fprintf(&b, "%s: %d of %d permits held", text(st.Key), st.Holders, st.Permits)
	case st.Shared:
		fmt.Fprintf(&b, "%s: shared by %d", text(st.Key), st.Holders)
	case !st.Held:
		fmt.Fprintf(&b, "%s: free", text(st.Key))
	default:
		fmt.Fprintf(&b, "%s: held by %s, %s", text(st.Key), text(st.Owner), left(st, ""))
	}
	if st.Fence > 0 {
		fmt.Fprintf(&b, "; fencing counter %d", st.Fence)
	}
	if st.Waiters > 0 {
		fmt.Fprintf(&b, "; %d waiting", st.Waiters)
	}
	return b.String()
}

// operator is what status, break and watch share: -json, and the lock
// that their flags name.
type operator struct {
	json  bool
	lock  *redislock.RedisLock
	close func() // closes the lock's client
}

// newOperator parses the flags of the command name, more adding its own,
// and opens the lock they name. It returns nil when the command is over,
// with its exit status (0 after -h).
func newOperator(name, usage string, args []string, stderr io.Writer, more func(*flag.FlagSet)) (*operator, int) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var conn connFlags
	conn.register(fs)
	o := &operator{}
	fs.BoolVar(&o.json, "json", false, "print JSON objects, one per line, for scripts")
	if more != nil {
		more(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, parseStatus(err)
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return nil, exitUsage
	}
	client, err := conn.client()
	if err != nil {
		complain(stderr, err)
		return nil, exitUsage
	}
	o.lock = redislock.NewRedisLock(redislock.FromGoRedis(client), fs.Arg(0))
	o.close = func() { client.Close() }
	return o, 0
}

// failed reports err and returns the exit status for it.
func failed(stderr io.Writer, err error) int {
	complain(stderr, err)
	switch {
	case errors.Is(err, redislock.ErrWrongType), errors.Is(err, redislock.ErrCorruptFencingCounter), errors.Is(err, redislock.ErrWrongKind):
		return exitNotALock
	case errors.Is(err, redislock.ErrEmptyKey), errors.Is(err, redislock.ErrKeyTooLong), errors.Is(err, redislock.ErrReservedKey):
		return exitUsage
	}
	return exitUnavailable
}

const statusUsage = `usage: redislock status [flags] KEY

Prints whether the lock KEY is held, by which owner id, for how long still,
its fencing counter and how many fair-lock waiters are queued; for a
semaphore or a shared lock, each holder and its lease left. Exits 0
whether the lock is held or free; 64 usage, 65 KEY holds something that is
not a lock, 69 Redis unavailable.

flags:
`

// statusCmd is "redislock status KEY".
func statusCmd(args []string, stdout, stderr io.Writer) int {
	o, code := newOperator("status", statusUsage, args, stderr, nil)
	if o == nil {
		return code
	}
	defer o.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := o.lock.Inspect(ctx)
	var holders []redislock.Holder
	if err == nil && (st.Permits > 0 || st.Shared) {
		holders, err = o.lock.Holders(ctx)
	}
	if err != nil {
		return failed(stderr, err)
	}
	if o.json {
		v := toJSON(st)
		for _, h := range holders {
			v.Holders = append(v.Holders, holderJSON{Owner: h.Owner, TTLms: h.TTL.Milliseconds()})
		}
		return printJSON(stdout, stderr, v)
	}
	line, sep := describe(st), ": "
	for _, h := range holders {
		line += sep + text(h.Owner) + " " + h.TTL.String() + " left"
		sep = ", "
	}
	fmt.Fprintln(stdout, line)
	return 0
}

func printJSON(stdout, stderr io.Writer, v statusJSON) int {
	b, err := json.Marshal(v)
	if err != nil {
		complain(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n", b)
	return 0
}

const breakUsage = `usage: redislock break [flags] KEY

Deletes the lock KEY on purpose, whoever holds it (or, with -owner, only
while that owner holds it), publishes its release so that waiters wake, and
says whom it took the lock from. The holder is not told at once: it learns
of the loss at its next renewal (within a third of its lease), and
"redislock run" then stops its command and exits 70. Exits 0 when the lock
was broken or was free; 64 usage, 65 KEY holds something that is not a
lock, 69 Redis unavailable, 75 held by another owner than -owner.

flags:
`

// breakCmd is "redislock break KEY".
func breakCmd(args []string, stdout, stderr io.Writer) int {
	var owner string
	o, code := newOperator("break", breakUsage, args, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&owner, "owner", "", "break the lock only while this owner id holds it (see status)")
	})
	if o == nil {
		return code
	}
	defer o.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := o.lock.Break(ctx, owner)
	switch {
	case errors.Is(err, redislock.ErrHeldByOther):
		fmt.Fprintf(stderr, "redislock: %s is held by %s, not %s: nothing broken\n", text(st.Key), text(st.Owner), text(owner))
		code = exitBusy
	case err != nil:
		return failed(stderr, err)
	}
	if o.json {
		broken := err == nil && st.Held
		v := toJSON(st)
		v.Broken = &broken
		if c := printJSON(stdout, stderr, v); c != 0 {
			return c
		}
		return code
	}
	switch {
	case code != 0:
	case !st.Held:
		fmt.Fprintf(stdout, "%s: free; nothing to break\n", text(st.Key))
	default:
		fmt.Fprintf(stdout, "%s: broken; it was held by %s (%s). Its holder learns of the loss at its next renewal; waiters were woken.\n",
			text(st.Key), text(st.Owner), left(st, " of its lease"))
	}
	return code
}

const watchUsage = `usage: redislock watch [flags] KEY

Prints the state of the lock KEY, then a line for each change of holder,
lease (a renewal shows as a lease extended), fencing counter or waiters, as
it happens, naming every change since the line before: it listens on the lock's release channel and polls every -poll.
Runs until interrupted (SIGINT or SIGTERM), then exits 0; 64 usage, 65 KEY
holds something that is not a lock, 69 Redis unavailable.

flags:
`

// watchCmd is "redislock watch KEY"; it runs until ctx ends.
func watchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var poll time.Duration
	o, code := newOperator("watch", watchUsage, args, stderr, func(fs *flag.FlagSet) {
		fs.DurationVar(&poll, "poll", time.Second, "how often to read the lock besides its releases")
	})
	if o == nil {
		return code
	}
	defer o.close()
	if poll <= 0 {
		fmt.Fprintf(stderr, "redislock: -poll %v: must be positive\n", poll)
		return exitUsage
	}
	var last redislock.Status
	first := true
	err := o.lock.Watch(ctx, poll, func(st redislock.Status) {
		now := time.Now()
		if o.json {
			v := toJSON(st)
			v.Time = now.Format(time.RFC3339Nano)
			printJSON(stdout, stderr, v)
		} else {
			fmt.Fprintf(stdout, "%s %s%s\n", now.Format("15:04:05.000"), describe(st), change(first, last, st))
		}
		last, first = st, false
	})
	if ctx.Err() != nil {
		return 0
	}
	return failed(stderr, err)
}

// change names, after a watch line, every change since the line before.
func change(first bool, was, now redislock.Status) string {
	if first {
		return ""
	}
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	switch {
	case !was.Held && now.Held:
		note("acquired")
	case was.Held && !now.Held:
		note("released, broken or expired")
	case was.Owner != now.Owner:
		note("was %s", text(was.Owner))
	case was.Expires.IsZero() && !now.Expires.IsZero():
		note("expiry set")
	case !was.Expires.IsZero() && now.Expires.IsZero():
		note("expiry removed")
	case now.Expires.Sub(was.Expires) > 2*time.Millisecond:
		note("lease extended") // the key's expiry, by the server's clock, moved later
	case now.Expires.Sub(was.Expires) < -2*time.Millisecond:
		note("lease shortened")
	}
	if was.Fence != now.Fence {
		note("fencing counter %d -> %d", was.Fence, now.Fence)
	}
	if was.Waiters != now.Waiters {
		note("waiters %d -> %d", was.Waiters, now.Waiters)
	}
	if len(notes) == 0 {
		return ""
	}
	return " (" + strings.Join(notes, "; ") + ")"
}

// left is the lease st's holder has left, as text: "3.2s left", with of
// between the duration and "left", or "no expiry".
func left(st redislock.Status, of string) string {
	if st.TTL < 0 {
		return "no expiry"
	}
	return st.TTL.String() + of + " left"
}

// text is s as the text output shows a key or an owner id: as it is, or
// quoted when it is empty, is not UTF-8 or holds control characters (a
// newline would split a line in two).
func text(s string) string {
	if s == "" || !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

// parseStatus is the exit status after a flag parsing error: 0 for -h.
func parseStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return exitUsage
}
