package store

import (
	"embed"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// lua holds the scripts, a file each, whose headers name their KEYS, ARGV
// and replies.
//
//go:embed *.lua
var lua embed.FS

// A Script is one of our Lua scripts, made of its files (see newScript).
type Script struct {
	*redis.Script
	src      string   // for EVAL
	readOnly bool     // writes nothing: sent with EVALSHA_RO where the client can
	replicas Replicas // zero: no WAIT follows it
}

// Replicas is how a script's writes wait for replicas: WAIT N Timeout,
// sent right after the script on the same connection, in one pipeline to
// its key's primary. A call is answered with ErrNotReplicated when fewer
// than N acknowledged within Timeout (the script ran), or when fewer than
// N are online (the script wrote nothing: see call.lua).
type Replicas struct {
	N       int
	Timeout time.Duration // at least a millisecond: WAIT's 0 waits for ever
}

// arg is the ARGV that call.lua takes off a call WAIT follows.
func (r Replicas) arg() string { return "redislock:replicas=" + strconv.Itoa(r.N) }

// replicated holds the Scripts of Replicated, by their script and Replicas.
var replicated sync.Map

// Replicated returns s followed by WAIT as r says; s itself for r.N <= 0.
// Calls of one Replicated script share a batch's script calls, as s's do.
func (s *Script) Replicated(r Replicas) *Script {
	if r.N <= 0 {
		return s
	}
	r.Timeout = max(r.Timeout, time.Millisecond)
	type key struct {
		s *Script
		r Replicas
	}
	if rs, ok := replicated.Load(key{s, r}); ok {
		return rs.(*Script)
	}
	rs, _ := replicated.LoadOrStore(key{s, r}, &Script{Script: s.Script, src: s.src, readOnly: s.readOnly, replicas: r})
	return rs.(*Script)
}

// The scripts. fence.lua and holders.lua are functions that they share.
var (
	Acquire       = newScript(false, "acquire_fast.lua", "call.lua", "fence.lua", "holders.lua", "acquire.lua")
	PermitAcquire = newScript(false, "permit_acquire_fast.lua", "call.lua", "fence.lua", "holders.lua", "permit_acquire.lua")
	Extend        = newScript(false, "call.lua", "extend.lua")
	ExtendHolders = newScript(false, "call.lua", "holders.lua", "extend_holders.lua")
	Release       = newScript(false, "record.lua", "release_fast.lua", "call.lua", "holders.lua", "release.lua")
	TTL           = newScript(true, "call.lua", "holders.lua", "ttl.lua")
	FairAcquire   = newScript(false, "call.lua", "fence.lua", "holders.lua", "fair_acquire.lua")
	FairRelease   = newScript(false, "record.lua", "call.lua", "fence.lua", "holders.lua", "fair_release.lua")
	Inspect       = newScript(true, "call.lua", "inspect.lua")
	Break         = newScript(false, "call.lua", "holders.lua", "break.lua")
	Leader        = newScript(true, "call.lua", "leader.lua")
	Proclaim      = newScript(false, "call.lua", "proclaim.lua")
)

// newScript is the script of files, in order: a fast path first, if it
// has one, made to run before call.lua makes its functions.
func newScript(readOnly bool, files ...string) *Script {
	var src strings.Builder
	for _, f := range files {
		b, _ := lua.ReadFile(f) // embedded: it reads
		src.Write(b)
	}
	return &Script{Script: redis.NewScript(src.String()), src: src.String(), readOnly: readOnly}
}

// Source returns the text the script is sent as.
func (s *Script) Source() string { return s.src }

// Files returns every embedded Lua file by its name.
func Files() map[string]string {
	names, _ := fs.Glob(lua, "*.lua")
	all := map[string]string{}
	for _, f := range names {
		b, _ := lua.ReadFile(f)
		all[f] = string(b)
	}
	return all
}

// All returns every script.
func All() []*Script {
	return []*Script{Acquire, PermitAcquire, Extend, ExtendHolders, Release, TTL, FairAcquire, FairRelease, Inspect, Break, Leader, Proclaim}
}
