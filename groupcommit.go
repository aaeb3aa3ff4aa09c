package redislock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Group commit: the acquisitions, re-entries, releases and TTLs of a
// Locker's locks share round trips when they come at once. A call made
// while none of the Locker's calls is in the network goes alone, at once, as
// it would without group commit (one goroutine pays nothing). Calls made
// while one is in the network queue up; when it is back, the caller that
// sent it hands the queue to a goroutine that sends it in one pipeline (one
// per server on a cluster or a ring), and so on, until nothing is queued.
// Calls that wait stallAfter go in a pipeline of their own beside the
// calls out, so a stalled call holds up no other for longer. The calls of one pipeline run one after
// another on the server, each an atomic script of its own, exactly as if
// they had been sent one by one.
//
// It needs a store with pipelines (a go-redis client, go-zero's store);
// other stores send each call alone.

// commits is a Locker's group commit of script calls.
type commits struct {
	mu     sync.Mutex
	out    int // senders with calls in the network; 0: the next call goes at once
	queue  []*scriptCall
	queued time.Time   // when the oldest queued call was queued
	stall  *time.Timer // sends the queue if it waits stallAfter
	send   func([]*scriptCall)
}

// scriptCall is one queued script call and, once done is closed, its
// result.
type scriptCall struct {
	store  Scripter
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	reply  any
	err    error
	done   chan struct{}
}

// errNotSent reports a queued call whose context ended before it was sent:
// it did not run, and never will.
var errNotSent = errors.New("redislock: not sent")

// maxGroup caps the calls of one group commit pipeline.
const maxGroup = 256

// stallAfter is how long calls wait for the calls in the network to come
// back: queued that long, they go in a pipeline of their own, so that a
// stalled call or server holds up no other call for longer.
const stallAfter = 10 * time.Millisecond

// runGrouped runs script through rl's Locker's group commit; alone runs
// one call by itself.
func (rl *RedisLock) runGrouped(ctx context.Context, script *redis.Script, keys []string, args []any,
	alone func() (any, error)) (any, error) {
	pipelined := pipelineOf(rl.store)
	if pipelined == nil {
		return alone()
	}
	l := rl.owner()
	c := &l.commits
	c.mu.Lock()
	if c.send == nil { // every lock of a Locker has its store
		useEval := rl.evaler != nil
		c.send = func(b []*scriptCall) { sendGroup(pipelined, useEval, b) }
	}
	if c.out == 0 {
		c.out = 1
		l.busier(1) // a shared Locker stays known while it sends
		send := c.send
		c.mu.Unlock()
		reply, err := alone()
		if batch := c.back(l); batch != nil {
			go c.sendAll(l, batch, send)
		}
		return reply, err
	}
	call := &scriptCall{store: rl.store, ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	c.queue = append(c.queue, call)
	if len(c.queue) == 1 {
		c.queued = time.Now()
		c.armStallLocked(l, stallAfter)
	}
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.reply, call.err
	case <-ctx.Done():
		if c.withdraw(call) {
			return nil, fmt.Errorf("%w: %w", errNotSent, ctx.Err())
		}
	}
	select { // sent: it may run
	case <-call.done:
		return call.reply, call.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// sendAll sends batch, then what has queued meanwhile, until nothing has.
func (c *commits) sendAll(l *Locker, batch []*scriptCall, send func([]*scriptCall)) {
	for ; batch != nil; batch = c.back(l) {
		send(batch)
	}
}

// back, called by a sender whose calls are back, gives it the next group of
// queued calls to send; nil when none is queued, and the sender is done.
func (c *commits) back(l *Locker) []*scriptCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.out--
		if c.out == 0 {
			l.busier(-1)
		}
		return nil
	}
	return c.takeLocked(l)
}

// takeLocked takes the next group of queued calls. The caller holds c.mu.
func (c *commits) takeLocked(l *Locker) []*scriptCall {
	n := min(len(c.queue), maxGroup)
	batch := append([]*scriptCall(nil), c.queue[:n]...)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	if len(c.queue) > 0 {
		c.queued = time.Now()
		c.armStallLocked(l, stallAfter)
	}
	return batch
}

func (c *commits) armStallLocked(l *Locker, d time.Duration) {
	if c.stall == nil {
		c.stall = time.AfterFunc(d, func() { c.stalled(l) })
	} else {
		c.stall.Reset(d)
	}
}

// stalled runs when calls may have waited stallAfter: if they have, they go
// in a pipeline of their own, beside the senders out.
func (c *commits) stalled(l *Locker) {
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.mu.Unlock()
		return
	}
	if wait := stallAfter - time.Since(c.queued); wait > 0 {
		c.armStallLocked(l, wait)
		c.mu.Unlock()
		return
	}
	c.out++
	batch := c.takeLocked(l)
	send := c.send
	c.mu.Unlock()
	c.sendAll(l, batch, send)
}

// withdraw takes call out of the queue if it was not sent yet.
func (c *commits) withdraw(call *scriptCall) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.queue {
		if x == call {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			return true
		}
	}
	return false
}

// sendGroup sends batch in one pipeline, with EVAL for go-zero's store
// (never a NOSCRIPT for its breaker), else EVALSHA, sending again with EVAL
// those that got NOSCRIPT. Calls whose context ended before are not sent.
// The pipeline is bounded by the latest deadline among the calls, if they
// all have one.
func sendGroup(pipelined func(context.Context, func(redis.Pipeliner) error) error, useEval bool, batch []*scriptCall) {
	// A cluster or a ring: one pipeline per server, all at once, so that a
	// slow server holds up its own calls only.
	perServer := func(g []*scriptCall) { sendGroup(pipelined, useEval, g) }
	key := func(call *scriptCall) string { return call.keys[0] }
	if eachServer(batch[0].ctx, batch[0].store, batch, key, perServer) {
		return
	}
	var live []*scriptCall
	var deadline time.Time
	bounded := true
	for _, call := range batch {
		if err := call.ctx.Err(); err != nil {
			call.err = fmt.Errorf("%w: %w", errNotSent, err)
			close(call.done)
			continue
		}
		d, ok := call.ctx.Deadline()
		bounded = bounded && ok
		if d.After(deadline) {
			deadline = d
		}
		live = append(live, call)
	}
	if len(live) == 0 {
		return
	}
	ctx := context.Background()
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	send := func(calls []*scriptCall, eval bool) {
		cmds := make([]*redis.Cmd, len(calls))
		err := pipelined(ctx, func(p redis.Pipeliner) error {
			for i, call := range calls {
				if eval {
					cmds[i] = p.Eval(ctx, sources[call.script], call.keys, call.args...)
				} else {
					cmds[i] = p.EvalSha(ctx, call.script.Hash(), call.keys, call.args...)
				}
			}
			return nil
		})
		for i, call := range calls {
			if cmds[i] == nil {
				call.reply, call.err = nil, cmpOr(err, fmt.Errorf("%w: call not sent", ErrUnexpectedReply))
				continue
			}
			call.reply, call.err = cmds[i].Result()
		}
	}
	send(live, useEval)
	if !useEval {
		var again []*scriptCall
		for _, call := range live {
			if call.err != nil && strings.HasPrefix(call.err.Error(), "NOSCRIPT") {
				again = append(again, call)
			}
		}
		if len(again) > 0 {
			send(again, true)
		}
	}
	for _, call := range live {
		close(call.done)
	}
}
