package store

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Errors of Redis replies; the root package exports them under the same
// names, with their documentation.
var (
	ErrUnexpectedReply       = errors.New("redislock: unexpected reply from redis")
	ErrCorruptFencingCounter = errors.New("redislock: fencing counter is not a number")
	ErrRefused               = errors.New("redislock: redis refused a command")
	ErrWrongKind             = errors.New("redislock: key holds another kind of lock")
	ErrNotReplicated         = errors.New("redislock: not replicated")
)

// errTooFewReplicas is the error of a call WAIT was to follow, with fewer
// replicas online than it asks for: it wrote nothing, and no WAIT waited.
var errTooFewReplicas = fmt.Errorf("%w: too few replicas online", ErrNotReplicated)

// replicasReply starts the error call.lua replies for too few replicas.
const replicasReply = "REDISLOCK_REPLICAS "

// notReplicated is the error of a call whose script ran but whose WAIT,
// for r, counted acked replicas, or failed with err.
func notReplicated(r Replicas, acked int64, err error) error {
	if err != nil { // %v: no redis.Error of WAIT's is to read as a refusal of the script's
		return fmt.Errorf("%w: WAIT %d %d: %v", ErrNotReplicated, r.N, r.Timeout.Milliseconds(), err)
	}
	return fmt.Errorf("%w: %d of %d replicas acknowledged the write (WAIT timed out at %v)", ErrNotReplicated, acked, r.N, r.Timeout)
}

// wrongKindReply starts the error a script replies when a key is another
// kind of lock than asked for (see holders.lua).
const wrongKindReply = "REDISLOCK_KIND "

// corruptCounterReply starts the error a script replies when a fencing
// counter holds something other than a number (see fence.lua).
const corruptCounterReply = "REDISLOCK_CORRUPT_COUNTER "

// refusalMark starts what call.lua appends to a refusal's text.
const refusalMark = " [redislock: "

// checkReply turns what a script call returned into our reply and error:
// a nil reply is ErrUnexpectedReply, a status naming a caller's mistake
// ErrWrongKind or ErrCorruptFencingCounter, and an error reply of Redis a
// Refusal, of command on key unless call.lua names another.
func checkReply(reply any, err error, command, key string) (any, error) {
	if status, ok := reply.(string); ok && err == nil &&
		(strings.HasPrefix(status, wrongKindReply) || strings.HasPrefix(status, corruptCounterReply)) {
		reply, err = nil, errors.New(status) // a caller's mistake, replied as a status (see call.lua)
	}
	var e redis.Error
	switch {
	case err != nil && strings.Contains(err.Error(), corruptCounterReply):
		_, counter, _ := strings.Cut(err.Error(), corruptCounterReply)
		return nil, fmt.Errorf("%w: %s", ErrCorruptFencingCounter, counter)
	case err != nil && strings.Contains(err.Error(), replicasReply):
		_, counts, _ := strings.Cut(err.Error(), replicasReply)
		online, want, _ := strings.Cut(counts, " ")
		return nil, fmt.Errorf("%w: %s online, %s asked for (nothing written)", errTooFewReplicas, online, want)
	case err != nil && strings.Contains(err.Error(), wrongKindReply):
		_, what, _ := strings.Cut(err.Error(), wrongKindReply)
		return nil, fmt.Errorf("%w: %s", ErrWrongKind, what)
	case errors.Is(err, redis.Nil) || (err == nil && reply == nil):
		return nil, fmt.Errorf("%w: nil", ErrUnexpectedReply)
	case errors.As(err, &e):
		return nil, refused(err, command, key)
	}
	return reply, err
}

// A Refusal is an error reply of Redis to a script call: ErrRefused,
// naming the command and key that call.lua reports (or the script call
// itself, EVALSHA and its first key), and wrapping the server's error.
type Refusal struct {
	Command, Key string
	err          error // a redis.Error
}

func refused(err error, command, key string) error {
	r := &Refusal{Command: command, Key: key, err: err}
	msg := err.Error()
	if i := strings.LastIndex(msg, refusalMark); i >= 0 && strings.HasSuffix(msg, "]") {
		r.Command, r.Key, _ = strings.Cut(msg[i+len(refusalMark):len(msg)-1], " ")
		r.err = serverError{err, msg[:i]}
	}
	return r
}

func (r *Refusal) Error() string {
	if r.Key == "" {
		return fmt.Sprintf("redis refused %s: %v", r.Command, r.err)
	}
	return fmt.Sprintf("redis refused %s %q: %v", r.Command, r.Key, r.err)
}

func (r *Refusal) Unwrap() []error { return []error{ErrRefused, r.err} }

// serverError is a redis.Error with call.lua's suffix taken off its text.
type serverError struct {
	err  error
	text string
}

func (e serverError) Error() string { return e.text }
func (e serverError) Unwrap() error { return e.err }
func (e serverError) RedisError()   {}

// Closed reports whether err follows the application's own Close of its
// client: go-redis's ErrClosed, or a connection closed on our side.
func Closed(err error) bool {
	return errors.Is(err, redis.ErrClosed) || errors.Is(err, net.ErrClosed)
}
