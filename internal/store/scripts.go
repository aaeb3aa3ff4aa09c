package store

import (
	"embed"
	"io/fs"
	"strings"

	"github.com/redis/go-redis/v9"
)

// lua holds the scripts, a file each, whose headers name their KEYS, ARGV
// and replies.
//
//go:embed *.lua
var lua embed.FS

// A Script is one of our Lua scripts: call.lua, then its files.
type Script struct {
	*redis.Script
	src      string // for EVAL
	readOnly bool   // writes nothing: sent with EVALSHA_RO where the client can
}

// The scripts. fence.lua and holders.lua are functions that they share.
var (
	Acquire       = newScript(false, "fence.lua", "holders.lua", "acquire.lua")
	PermitAcquire = newScript(false, "fence.lua", "holders.lua", "permit_acquire.lua")
	Extend        = newScript(false, "holders.lua", "extend.lua")
	Release       = newScript(false, "record.lua", "holders.lua", "release.lua")
	TTL           = newScript(true, "holders.lua", "ttl.lua")
	FairAcquire   = newScript(false, "fence.lua", "holders.lua", "fair_acquire.lua")
	FairRelease   = newScript(false, "fence.lua", "record.lua", "holders.lua", "fair_release.lua")
	Inspect       = newScript(true, "inspect.lua")
	Break         = newScript(false, "holders.lua", "break.lua")
)

func newScript(readOnly bool, files ...string) *Script {
	var src strings.Builder
	for _, f := range append([]string{"call.lua"}, files...) {
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
	return []*Script{Acquire, PermitAcquire, Extend, Release, TTL, FairAcquire, FairRelease, Inspect, Break}
}
