package store

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// unexpected is the error of a reply none of our scripts gives.
func unexpected(reply any, due string) error {
	return fmt.Errorf("%w: %T %.64v where %s was due", ErrUnexpectedReply, reply, reply, due)
}

// ParseAcquire reads the reply of acquire.lua (and a taking reply of
// fair_acquire.lua): the fencing token (0 when not fenced) of a lock
// taken, or -1 and the holder's PTTL (-1 ms: no expiry; 0: an attempt
// given up).
func ParseAcquire(reply any, fenced bool) (token int64, pttl time.Duration, err error) {
	switch v := reply.(type) {
	case int64:
		if v >= -1 {
			return -1, time.Duration(v) * time.Millisecond, nil
		}
	case string:
		if v == "OK" && !fenced {
			return 0, 0, nil
		}
	case []any:
		if len(v) == 2 && v[0] == "OK" && fenced {
			if t, ok := v[1].(int64); ok && t > 0 {
				return t, 0, nil
			}
		}
	}
	return 0, 0, unexpected(reply, "OK or a PTTL")
}

// ParseFairAcquire reads the reply of fair_acquire.lua: as ParseAcquire,
// or -1, how long to wait before the next attempt, and the waiter's score
// in the queue.
func ParseFairAcquire(reply any, fenced bool) (token int64, wait time.Duration, seq int64, err error) {
	if v, ok := reply.([]any); ok && len(v) == 2 {
		wait, okWait := v[0].(int64)
		seq, okSeq := v[1].(int64)
		if okWait && okSeq && wait >= -1 && seq >= 0 {
			return -1, time.Duration(wait) * time.Millisecond, seq, nil
		}
	}
	token, w, err := ParseAcquire(reply, fenced)
	return token, w, 0, err
}

// RenewalCodes reads the reply of an extend.lua call of n keys: n codes,
// each 0 (lost) or 1 (renewed), all 0 with an error.
func RenewalCodes(c *Call, n int) ([]int64, error) {
	codes := make([]int64, n)
	if c.Err != nil {
		return codes, c.Err
	}
	values, ok := c.Reply.([]any)
	if !ok || len(values) != n {
		return codes, unexpected(c.Reply, fmt.Sprint(n, " codes"))
	}
	for i := range codes {
		code, isInt := values[i].(int64)
		if !isInt || code < 0 || code > 1 {
			return make([]int64, n), unexpected(values[i], "0 or 1")
		}
		codes[i] = code
	}
	return codes, nil
}

// ReleaseCode reads the reply of a release call (release.lua or
// fair_release.lua): 1 released (a fair release's handoff message counts
// as one), 3 released but nobody woken (the PUBLISH refused), 2 released
// already (a retry), 0 not ours: a loss.
func ReleaseCode(c *Call) (int64, error) {
	if c.Err != nil {
		return 0, c.Err
	}
	if m, ok := c.Reply.(string); ok && c.Script == FairRelease {
		unheard, refused := strings.CutPrefix(m, "!")
		first, _, _ := strings.Cut(unheard, "\n") // a message per waiter handed a share
		if _, _, handoff := ParseHandoff(first); handoff && refused {
			return 3, nil
		} else if handoff {
			return 1, nil
		}
	}
	n, ok := c.Reply.(int64)
	if !ok || n < 0 || n > 3 {
		return 0, unexpected(c.Reply, "0, 1, 2 or 3")
	}
	return n, nil
}

// Handoff is a fair release's message that handed the lock to a waiter.
type Handoff struct {
	Seq   int64         // the waiter's score in the queue
	Token int64         // its fencing token; 0 when not fenced
	Lease time.Duration // the lease it was given
}

// ParseHandoff reads fair_release.lua's message "<id> <seq> <token>
// <lease>" (or its reply, which may start with "!"); ok is false for
// anything else (an empty message is a release that handed nothing on).
func ParseHandoff(payload string) (id string, m Handoff, ok bool) {
	f := strings.Fields(strings.TrimPrefix(payload, "!"))
	if len(f) != 4 {
		return "", Handoff{}, false
	}
	seq, err1 := strconv.ParseFloat(f[1], 64)
	token, err2 := strconv.ParseInt(f[2], 10, 64)
	lease, err3 := strconv.ParseInt(f[3], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || seq < 0 || seq >= 1<<53 || lease <= 0 {
		return "", Handoff{}, false
	}
	return f[0], Handoff{Seq: int64(seq), Token: token, Lease: time.Duration(lease) * time.Millisecond}, true
}

// ParseTTL reads the reply of ttl.lua: the lease left (-1: no expiry), and
// false when the key does not hold the owner.
func ParseTTL(reply any) (time.Duration, bool, error) {
	ms, ok := reply.(int64)
	switch {
	case !ok || ms < -2:
		return 0, false, unexpected(reply, "a PTTL")
	case ms == -2:
		return 0, false, nil
	}
	return LeaseLeft(ms), true, nil
}

// An Inspection is the reply of inspect.lua.
type Inspection struct {
	Kind, Owner string // the key's type ("none": free), and its value when a string
	PTTL        int64
	Counter     string // "=" and the fencing counter's value; "" when missing; "(type)" when not a string
	Waiters     int64
	Expires     int64 // ms of the server's clock; -1 without expiry, -2 missing
	// Holders of a sorted set, by id: each live holder's lease left in ms,
	// and its mark's score (see holders.lua).
	Holders map[string]int64
}

// The marks of a semaphore's key and of a shared lock's (see holders.lua).
const (
	PermitsMark = "redislock:permits"
	SharedMark  = "redislock:shared"
)

// ParseInspect reads the reply of inspect.lua.
func ParseInspect(reply any) (Inspection, error) {
	v, ok := reply.([]any)
	if !ok || len(v) != 7 {
		return Inspection{}, unexpected(reply, "7 values")
	}
	var in Inspection
	var ok1, ok2, ok3, ok4, ok5, ok6 bool
	in.Kind, ok1 = v[0].(string)
	in.Owner, ok2 = v[1].(string)
	in.PTTL, ok3 = v[2].(int64)
	in.Counter, ok4 = v[3].(string)
	in.Waiters, ok5 = v[4].(int64)
	in.Expires, ok6 = v[5].(int64)
	holders, ok7 := v[6].([]any)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 || len(holders)%2 != 0 || in.PTTL < -2 || in.Waiters < 0 {
		return Inspection{}, unexpected(reply, "an inspection")
	}
	in.Holders = map[string]int64{}
	for i := 0; i < len(holders); i += 2 {
		id, ok1 := holders[i].(string)
		left, ok2 := holders[i+1].(int64)
		if !ok1 || !ok2 {
			return Inspection{}, unexpected(reply, "an inspection")
		}
		in.Holders[id] = left
	}
	return in, nil
}

// ParseBreak reads the reply of break.lua: its code, and the owner and
// PTTL the key had.
func ParseBreak(reply any) (code int64, owner string, pttl int64, err error) {
	v, ok := reply.([]any)
	if ok && len(v) == 3 {
		code, ok1 := v[0].(int64)
		owner, ok2 := v[1].(string)
		pttl, ok3 := v[2].(int64)
		if ok1 && ok2 && ok3 && code >= -1 && code <= 3 && pttl >= -2 {
			return code, owner, pttl, nil
		}
	}
	return 0, "", 0, unexpected(reply, "a break")
}

// ParseCounter reads a fencing counter as fence.lua writes it: decimal
// digits only, at most 2^53-1 (the last token, after which acquisitions
// refuse the counter as used up).
func ParseCounter(s string) (int64, bool) {
	if s == "" || len(s) > 16 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n <= 1<<53-1
}

// LeaseLeft converts a PTTL reply of a key that exists: -1 when it has no
// expiry, and at most the longest Duration (292 years).
func LeaseLeft(pttl int64) time.Duration {
	switch {
	case pttl < 0:
		return -1 // no expiry; -2 (gone just now) cannot follow a GET
	case pttl > math.MaxInt64/int64(time.Millisecond):
		return math.MaxInt64
	}
	return time.Duration(pttl) * time.Millisecond
}

// A Proclaimed is a value that an election's leader proclaimed, with
// what orders proclaims: the leader's term, and the proclaim's number
// within it, from 1.
type Proclaimed struct {
	Term, N int64
	Value   string
}

// After reports whether p was proclaimed after q.
func (p Proclaimed) After(q Proclaimed) bool {
	return p.Term > q.Term || p.Term == q.Term && p.N > q.N
}

// Next reports whether p is the proclaim right after q: none came between.
func (p Proclaimed) Next(q Proclaimed) bool {
	return p.Term == q.Term && p.N == q.N+1 || p.Term > q.Term && p.N == 1
}

// ParseLeader reads the reply of leader.lua: the leader's latest proclaim
// (its Value "" when nobody leads or it has proclaimed none), and its
// term's remaining lease (0 when nobody leads, -1 when the key has no
// expiry).
func ParseLeader(reply any) (p Proclaimed, left time.Duration, err error) {
	r, ok := reply.([]any)
	if !ok || len(r) != 4 {
		return p, 0, unexpected(reply, "a leader")
	}
	value, ok1 := r[0].(string)
	pttl, ok2 := r[1].(int64)
	term, ok3 := r[2].(int64)
	n, ok4 := r[3].(int64)
	switch {
	case !ok1 || !ok2 || !ok3 || !ok4 || pttl < -2:
		return p, 0, unexpected(reply, "a leader")
	case pttl == -2:
		return p, 0, nil
	}
	return Proclaimed{Term: term, N: n, Value: value}, LeaseLeft(pttl), nil
}

// ParseProclaimed reads a message of proclaim.lua.
func ParseProclaimed(payload string) (Proclaimed, bool) {
	f := strings.SplitN(payload, "\n", 3)
	if len(f) != 3 {
		return Proclaimed{}, false
	}
	term, err1 := strconv.ParseInt(f[0], 10, 64)
	n, err2 := strconv.ParseInt(f[1], 10, 64)
	return Proclaimed{Term: term, N: n, Value: f[2]}, err1 == nil && err2 == nil
}
