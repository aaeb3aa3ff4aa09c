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
// sent it hands the queue to a goroutine that sends it in one pipeline, and
// so on, until nothing is queued. The calls of one pipeline run one after
// another on the server, each an atomic script of its own, exactly as if
// they had been sent one by one.
//
// It needs a store with pipelines (a go-redis client, go-zero's store);
// other stores send each call alone.

// commits is a Locker's group commit of script calls.
type commits struct {
	mu    sync.Mutex
	state commitState
	queue []*scriptCall
}

// commitState is whether a Locker's script calls are in the network.
type commitState int

const (
	idle    commitState = iota // none: the next call goes at once
	sending                    // some: calls queue until they are back
)

// scriptCall is one queued script call and, once done is closed, its
// result.
type scriptCall struct {
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
	if c.state == idle {
		c.state = sending
		l.busier(1) // a shared Locker stays known while it sends
		c.mu.Unlock()
		reply, err := alone()
		c.handOn(l, func(batch []*scriptCall) { sendGroup(pipelined, rl.evaler != nil, batch) })
		return reply, err
	}
	call := &scriptCall{ctx: ctx, script: script, keys: keys, args: args, done: make(chan struct{})}
	c.queue = append(c.queue, call)
	c.mu.Unlock()
	select {
	case <-call.done:
		return call.reply, call.err
	case <-ctx.Done():
		if c.withdraw(call) {
			return nil, fmt.Errorf("%w: %w", errNotSent, ctx.Err())
		}
		return nil, ctx.Err() // sent: it may run
	}
}

// handOn, called by the caller whose call is back, ends the sending state
// or hands the queued calls to a goroutine that sends them, group by group,
// until none is queued.
func (c *commits) handOn(l *Locker, send func([]*scriptCall)) {
	batch := c.next(l)
	if batch == nil {
		return
	}
	go func() {
		for ; batch != nil; batch = c.next(l) {
			send(batch)
		}
	}()
}

// next takes the next group of queued calls; nil, and the idle state, when
// none is queued.
func (c *commits) next(l *Locker) []*scriptCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.state = idle
		l.busier(-1)
		return nil
	}
	n := min(len(c.queue), maxGroup)
	batch := append([]*scriptCall(nil), c.queue[:n]...)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	return batch
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
