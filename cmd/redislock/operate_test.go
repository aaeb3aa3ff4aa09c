package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redislock/redislock"
	"github.com/redislock/redislock/internal/redisserver"
)

func decodeStatus(t *testing.T, s string) statusJSON {
	t.Helper()
	var v statusJSON
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not a JSON status: %q: %v", s, err)
	}
	return v
}

// TestStatusJSON: status -json shows what the holder's own RedisLock
// says of itself, and a fair lock's waiters.
func TestStatusJSON(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	var out, errOut lockedBuffer
	if code := run([]string{"status", "-addr", srv.Addr, "-json", "inv"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if v := decodeStatus(t, out.String()); !reflect.DeepEqual(v, statusJSON{Key: "inv"}) {
		t.Fatalf("free: %+v", v)
	}

	holder := redislock.NewRedisLock(redislock.FromGoRedis(srv.Client(t)), "inv", redislock.WithFairness(), redislock.WithFencing())
	if ok, err := holder.Acquire(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer holder.Release()
	waiter := redislock.NewRedisLock(redislock.FromGoRedis(srv.Client(t)), "inv", redislock.WithFairness())
	waitCtx, stop := context.WithCancel(ctx)
	defer stop()
	go waiter.AcquireWait(waitCtx)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		out.Reset()
		if code := run([]string{"status", "-addr", srv.Addr, "-json", "inv"}, &out, &errOut); code != 0 {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
		v := decodeStatus(t, out.String())
		if !v.Held || v.Owner != holder.Owner() || v.Fence != holder.Token() || v.Fence == 0 ||
			v.TTLms <= 0 || v.TTLms > redislock.DefaultExpiry.Milliseconds() {
			t.Fatalf("held: %+v; want owner %s, fence %d", v, holder.Owner(), holder.Token())
		}
		if v.Waiters == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("held: %+v; want 1 waiter", v)
		}
	}
	out.Reset()
	if code := run([]string{"status", "-addr", srv.Addr, "inv"}, &out, &errOut); code != 0 ||
		!strings.HasPrefix(out.String(), "inv: held by "+holder.Owner()+", ") ||
		!strings.Contains(out.String(), " left; fencing counter ") || !strings.HasSuffix(out.String(), "; 1 waiting\n") {
		t.Fatalf("text: %d %q", code, out.String())
	}

	srv.Client(t).HSet(ctx, "hash", "a", "b")
	for _, cmd := range []string{"status", "break"} {
		errOut.Reset()
		if code := run([]string{cmd, "-addr", srv.Addr, "hash"}, &out, &errOut); code != exitNotALock ||
			!strings.Contains(errOut.String(), "not a lock") {
			t.Fatalf("%s of a hash: %d %q", cmd, code, errOut.String())
		}
	}
	if srv.Client(t).Exists(ctx, "hash").Val() != 1 {
		t.Fatal("break deleted a hash")
	}
}

// TestBreakCommand breaks an outsider's lock only with its owner id, then
// the lock of a "redislock run": the run's command is stopped (exit 70) at
// its next renewal, and a run waiting for the lock gets it.
func TestBreakCommand(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	var out, errOut lockedBuffer

	if code := run([]string{"break", "-addr", srv.Addr, "stuck"}, &out, &errOut); code != 0 || out.String() != "stuck: free; nothing to break\n" {
		t.Fatalf("break of a free lock: %d %q %q", code, out.String(), errOut.String())
	}
	admin.Set(ctx, "stuck", "crashed-worker", time.Hour)
	out.Reset()
	if code := run([]string{"break", "-addr", srv.Addr, "-owner", "someone", "stuck"}, &out, &errOut); code != exitBusy ||
		!strings.Contains(errOut.String(), "held by crashed-worker, not someone") {
		t.Fatalf("break -owner of another's lock: %d %q", code, errOut.String())
	}
	if admin.Get(ctx, "stuck").Val() != "crashed-worker" {
		t.Fatal("break -owner deleted another owner's lock")
	}
	out.Reset()
	if code := run([]string{"break", "-addr", srv.Addr, "-owner", "crashed-worker", "-json", "stuck"}, &out, &errOut); code != 0 {
		t.Fatalf("break -owner: %d %q", code, errOut.String())
	}
	if v := decodeStatus(t, out.String()); v.Broken == nil || !*v.Broken || v.Owner != "crashed-worker" || v.TTLms <= 0 {
		t.Fatalf("break -owner -json: %q", out.String())
	}
	if admin.Exists(ctx, "stuck").Val() != 0 {
		t.Fatal("break -owner left the key")
	}

	// A run that holds the lock, and one that waits for it.
	f := marksFile(t)
	holder := newCLI(t, f, "run", "-addr", srv.Addr, "-ttl", "900ms", "job", "--", "sh", "-c",
		`trap 'echo stopped >> "$F"; kill $!; exit 0' TERM; echo owner-$REDISLOCK_OWNER >> "$F"; sleep 30 & wait`)
	if err := holder.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var owner string
	for end := time.Now().Add(10 * time.Second); owner == ""; time.Sleep(5 * time.Millisecond) {
		for _, m := range readMarks(t, f) {
			owner = strings.TrimPrefix(m, "owner-")
		}
		if time.Now().After(end) {
			t.Fatal("the holder's command did not start")
		}
	}
	next := newCLI(t, f, "run", "-addr", srv.Addr, "-wait", "60s", "job", "--", "sh", "-c", `echo next-ran >> "$F"`)
	if err := next.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"break", "-addr", srv.Addr, "job"}, &out, &errOut); code != 0 ||
		!strings.HasPrefix(out.String(), "job: broken; it was held by "+owner+" (") ||
		!strings.Contains(out.String(), "learns of the loss at its next renewal") {
		t.Fatalf("break: %d %q %q", code, out.String(), errOut.String())
	}
	if code := holder.code(t); code != exitLost || !strings.Contains(holder.errOut.String(), "lock lost") {
		t.Fatalf("the broken run: exit %d, stderr %q; want %d, lock lost", code, holder.errOut, exitLost)
	}
	if code := next.code(t); code != 0 {
		t.Fatalf("the waiting run: exit %d, stderr %q", code, next.errOut)
	}
	marks := readMarks(t, f)
	if len(marks) != 3 || marks[0] != "owner-"+owner || !strings.Contains(strings.Join(marks, " "), "next-ran") {
		t.Fatalf("marks %v; want the holder, its stop and the next run", marks)
	}
}

// TestWatchCommand watches a fair lock change hands: the holder, its
// waiter queued, the handoff (never free in between) and the end, in that
// order, until SIGINT ends the watch with status 0.
func TestWatchCommand(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	var out lockedBuffer
	w := newCLI(t, marksFile(t), "watch", "-addr", srv.Addr, "-poll", "50ms", "fair")
	w.cmd.Stdout = &out
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.cmd.Process.Kill()
	lines := func() []string { return strings.Split(strings.TrimSpace(out.String()), "\n") }
	saw := func(what string, cond func(last string) bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if l := lines(); cond(l[len(l)-1]) {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("watch did not show %s: %q; stderr %q", what, out.String(), w.errOut)
			}
		}
	}
	saw("the free lock", func(last string) bool { return strings.HasSuffix(last, " fair: free") })

	opts := []redislock.Option{redislock.WithFairness(), redislock.WithExpiry(time.Second)}
	a := redislock.NewRedisLock(redislock.FromGoRedis(srv.Client(t)), "fair", opts...)
	b := redislock.NewRedisLock(redislock.FromGoRedis(srv.Client(t)), "fair", opts...)
	if ok, err := a.Acquire(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	saw("a holding", func(last string) bool { return strings.Contains(last, "held by "+a.Owner()) })
	bHolds := make(chan error, 1)
	go func() { bHolds <- b.AcquireWait(ctx) }()
	saw("b waiting", func(last string) bool { return strings.Contains(last, "; 1 waiting") })
	idA := a.Owner()
	if ok, err := a.Release(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := <-bHolds; err != nil {
		t.Fatal(err)
	}
	saw("the handoff", func(last string) bool { return strings.Contains(last, "held by "+b.Owner()+", ") })
	if ok, err := b.Release(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	saw("the end", func(last string) bool { return strings.HasSuffix(last, "fair: free (released, broken or expired)") })
	_ = w.cmd.Process.Signal(syscall.SIGINT)
	if code := w.code(t); code != 0 {
		t.Fatalf("watch exited %d after SIGINT; stderr %q", code, w.errOut)
	}

	// In order: free, a (renewed or not), a with b waiting, b (was a), free.
	var order []string
	for _, l := range lines() {
		var who string
		switch {
		case strings.Contains(l, "held by "+idA):
			who = "a"
		case strings.Contains(l, "held by "+b.Owner()):
			who = "b"
			if !strings.Contains(l, "(was "+idA) {
				t.Errorf("the handoff line %q does not name a", l)
			}
		case strings.Contains(l, ": free"):
			who = "free"
		default:
			t.Fatalf("watch printed %q", l)
		}
		if len(order) > 0 && order[len(order)-1] == who && who != "free" && !strings.HasSuffix(l, ")") {
			t.Errorf("a line of the same holder says nothing of what changed: %q", l)
		}
		if len(order) == 0 || order[len(order)-1] != who {
			order = append(order, who)
		}
	}
	if got := strings.Join(order, " "); got != "free a b free" {
		t.Fatalf("watch saw %q; want free a b free (no free between a and b):\n%s", got, out.String())
	}
}

// TestRunBrokenAndTakenBeforeItsRenewal: the lock of a run is broken and
// taken by another owner, and the command exits before the next renewal
// could tell: the release finds the key taken, and run exits 70, not the
// command's 0 (black-box round 9).
func TestRunBrokenAndTakenBeforeItsRenewal(t *testing.T) {
	srv := redisserver.Start(t)
	admin := srv.Client(t)
	f := marksFile(t)
	gate := filepath.Join(t.TempDir(), "go")
	c := newCLI(t, f, "run", "-addr", srv.Addr, "-ttl", "30s", "quick", "--", "sh", "-c",
		`echo started >> "$F"; while [ ! -e "$1" ]; do sleep 0.01; done`, "sh", gate)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitMark(t, f, "started")
	var out lockedBuffer
	if code := run([]string{"break", "-addr", srv.Addr, "quick"}, &out, &out); code != 0 {
		t.Fatalf("break: %d %s", code, out.String())
	}
	admin.Set(context.Background(), "quick", "someone-else", time.Minute)
	if err := os.WriteFile(gate, nil, 0o644); err != nil { // the command exits 0, well before the renewal at 10s
		t.Fatal(err)
	}
	if code := c.code(t); code != exitLost || !strings.Contains(c.errOut.String(), "lock lost") {
		t.Fatalf("exit %d, stderr %q; want %d, lock lost", code, c.errOut, exitLost)
	}
	if admin.Get(context.Background(), "quick").Val() != "someone-else" {
		t.Fatal("run touched the new holder's lock")
	}
}

// TestHelpExitsZero: -h of every command prints its usage and exits 0
// (black-box round 9: 64, which help gives to bad flags).
func TestHelpExitsZero(t *testing.T) {
	for _, cmd := range []string{"run", "status", "break", "watch", "demo"} {
		var out, errOut lockedBuffer
		if code := run([]string{cmd, "-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "-addr") {
			t.Errorf("%s -h: exit %d, %q", cmd, code, errOut.String())
		}
	}
	var out, errOut lockedBuffer
	if code := run([]string{"help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "65   the key holds something that is not a lock") {
		t.Errorf("help: exit %d, %q", code, out.String())
	}
}

// TestTextQuotesOddKeys: keys and owner ids that are empty, not UTF-8 or
// hold control characters are quoted, so that each status is one line.
func TestTextQuotesOddKeys(t *testing.T) {
	for in, want := range map[string]string{"plain:key": "plain:key", "a\nb": `"a\nb"`, "": `""`, "\xff": `"\xff"`, "ключ": "ключ"} {
		if got := text(in); got != want {
			t.Errorf("text(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestChangeNotesEveryChange: a watch line names every change since the
// line before, a lease extended beside waiters that left included
// (black-box round 10: the extension went unnamed).
func TestChangeNotesEveryChange(t *testing.T) {
	t0 := time.Now()
	was := redislock.Status{Key: "k", Held: true, Owner: "a", TTL: 5 * time.Second, Expires: t0, Fence: 7, Waiters: 1}
	free := redislock.Status{Key: "k", Fence: 7, Waiters: 1}
	if got := change(false, free, was); got != " (acquired)" {
		t.Errorf("change from free = %q", got)
	}
	if got := change(false, redislock.Status{Key: "k", Held: true, Owner: "a", TTL: -1, Fence: 7, Waiters: 1}, was); got != " (expiry set)" {
		t.Errorf("change to an expiry = %q", got)
	}
	for _, tc := range []struct {
		now  redislock.Status
		want string
	}{
		{redislock.Status{Key: "k", Held: true, Owner: "a", TTL: 8 * time.Second, Expires: t0.Add(4 * time.Second), Fence: 7}, " (lease extended; waiters 1 -> 0)"},
		{redislock.Status{Key: "k", Held: true, Owner: "a", TTL: 8 * time.Second, Expires: t0.Add(4 * time.Second), Fence: 7, Waiters: 1}, " (lease extended)"},
		{redislock.Status{Key: "k", Held: true, Owner: "a", TTL: 4 * time.Second, Expires: t0, Fence: 7, Waiters: 2}, " (waiters 1 -> 2)"},
		{redislock.Status{Key: "k", Held: true, Owner: "b", TTL: 9 * time.Second, Expires: t0.Add(5 * time.Second), Fence: 8}, " (was a; fencing counter 7 -> 8; waiters 1 -> 0)"},
		{redislock.Status{Key: "k", Fence: 7}, " (released, broken or expired; waiters 1 -> 0)"},
		{redislock.Status{Key: "k", Held: true, Owner: "a", TTL: -1, Fence: 7, Waiters: 1}, " (expiry removed)"},
		{redislock.Status{Key: "k", Held: true, Owner: "a", TTL: time.Second, Expires: t0.Add(-4 * time.Second), Fence: 7, Waiters: 1}, " (lease shortened)"},
		{redislock.Status{Key: "k", Held: true, Owner: "a", TTL: 5 * time.Second, Expires: t0, Fence: 9, Waiters: 1}, " (fencing counter 7 -> 9)"},
	} {
		if got := change(false, was, tc.now); got != tc.want {
			t.Errorf("change to %+v = %q, want %q", tc.now, got, tc.want)
		}
	}
}
