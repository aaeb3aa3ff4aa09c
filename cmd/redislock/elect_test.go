package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redislock/redislock"
	"github.com/redislock/redislock/internal/redisserver"
)

// TestElectCommand: three "redislock elect" processes run their commands
// one at a time, in arrival order, each with a higher term; "leader"
// prints the leader's value, and with -watch each change; -wait gives up
// with 75, as "leader" does when nobody leads.
func TestElectCommand(t *testing.T) {
	srv := redisserver.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	f := marksFile(t)
	gate := f + ".go"
	script := `echo start-$1-$REDISLOCK_TERM >> "$F"; while [ ! -e "` + gate + `" ]; do sleep 0.02; done; echo end-$1 >> "$F"`

	var watched lockedBuffer
	wctx, stopWatching := context.WithCancel(ctx)
	watching := make(chan int, 1)
	go func() {
		watching <- leaderCmd(wctx, []string{"-addr", srv.Addr, "-watch", "elected"}, &watched, &watched)
	}()

	var wg sync.WaitGroup
	codes := make([]int, 3)
	for i := range codes {
		cl := newCLI(t, f, "elect", "-addr", srv.Addr, "-value", "v"+strconv.Itoa(i), "elected", "--", "sh", "-c", script, "sh", strconv.Itoa(i))
		if err := cl.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = cl.code(t) }()
		if i == 0 {
			for deadline := time.Now().Add(10 * time.Second); !strings.HasPrefix(strings.Join(readMarks(t, f), " "), "start-0-"); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the first candidate's command did not start")
				}
			}
			continue
		}
		for deadline := time.Now().Add(10 * time.Second); c.ZCard(ctx, "{elected}:redislock:queue").Val() != int64(i); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("candidate %d did not queue", i)
			}
		}
	}
	var out lockedBuffer
	if code := run([]string{"elect", "-addr", srv.Addr, "-value", "", "elected", "--", "true"}, &out, &out); code != exitUsage {
		t.Fatalf("elect -value \"\": exit %d: %s", code, out.String())
	}
	out.Reset()
	if code := run([]string{"leader", "-addr", srv.Addr, "elected"}, &out, &out); code != 0 || out.String() != "v0\n" {
		t.Fatalf("leader: exit %d: %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"elect", "-addr", srv.Addr, "-wait", "200ms", "elected", "--", "true"}, &out, &out); code != exitBusy {
		t.Fatalf("elect -wait 200ms while another leads: exit %d: %s", code, out.String())
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, code := range codes {
		if code != 0 {
			t.Fatalf("elect %d exited %d", i, code)
		}
	}
	marks := readMarks(t, f)
	if len(marks) != 6 {
		t.Fatalf("marks %v", marks)
	}
	var term int64
	for i := 0; i < 3; i++ { // start-i-TERM end-i, in arrival order, terms rising
		start := strings.Split(marks[2*i], "-")
		n, _ := strconv.ParseInt(start[2], 10, 64)
		if start[1] != strconv.Itoa(i) || marks[2*i+1] != "end-"+strconv.Itoa(i) || n <= term {
			t.Fatalf("marks %v", marks)
		}
		term = n
	}
	out.Reset()
	if code := run([]string{"leader", "-addr", srv.Addr, "elected"}, &out, &out); code != exitBusy {
		t.Fatalf("leader with nobody leading: exit %d: %q", code, out.String())
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.HasSuffix(watched.String(), "v2\n\n"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			break
		}
	}
	stopWatching()
	if code := <-watching; code != 0 {
		t.Fatalf("leader -watch: exit %d", code)
	}
	var values []string
	for _, v := range strings.Split(watched.String(), "\n") {
		if v != "" {
			values = append(values, v)
		}
	}
	if strings.Join(values, " ") != "v0 v1 v2" || !strings.HasPrefix(watched.String(), "\nv0\n") {
		t.Fatalf("leader -watch printed %q", watched.String())
	}
}

// TestStatusAndBreakOfAnElection: "status" on an election's key names the
// leader's owner id, the latest term (the fencing counter) and the
// candidates waiting; "break" ends the term: the leader learns of the loss
// (Done, ErrLockLost) and the next candidate leads, in a later term.
func TestStatusAndBreakOfAnElection(t *testing.T) {
	srv := redisserver.Start(t)
	ctx := context.Background()
	st := redislock.FromGoRedis(srv.Client(t))
	leader, next := redislock.NewElection(st, "broken", redislock.WithExpiry(time.Second)), redislock.NewElection(st, "broken")
	if err := leader.Campaign(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	campaigned := make(chan error, 1)
	go func() { campaigned <- next.Campaign(ctx, "b") }()
	for deadline := time.Now().Add(10 * time.Second); srv.Client(t).ZCard(ctx, "{broken}:redislock:queue").Val() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the candidate did not queue")
		}
	}
	var out lockedBuffer
	term := leader.Term()
	seen, err := redislock.NewRedisLock(st, "broken").Inspect(ctx)
	if err != nil || seen.Owner == "" {
		t.Fatal(seen, err)
	}
	want := fmt.Sprintf("broken: held by %s, ", seen.Owner)
	if code := run([]string{"status", "-addr", srv.Addr, "broken"}, &out, &out); code != 0 || !strings.HasPrefix(out.String(), want) ||
		!strings.HasSuffix(out.String(), fmt.Sprintf("; fencing counter %d; 1 waiting\n", term)) {
		t.Fatalf("status: exit %d: %q; want %q..., the term %d and 1 waiting", code, out.String(), want, term)
	}
	out.Reset()
	if code := run([]string{"break", "-addr", srv.Addr, "broken"}, &out, &out); code != 0 || !strings.Contains(out.String(), "broken; it was held by") {
		t.Fatalf("break: exit %d: %q", code, out.String())
	}
	if err := <-campaigned; err != nil {
		t.Fatalf("the next candidate after the break: %v", err)
	}
	select {
	case <-leader.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the broken leader never learnt of its loss")
	}
	if !errors.Is(leader.Err(), redislock.ErrLockLost) || leader.IsLeader() || next.Term() <= term {
		t.Fatalf("after the break: leader's Err %v (leads %v); next term %d, not above %d", leader.Err(), leader.IsLeader(), next.Term(), term)
	}
	if v, err := next.Leader(ctx); v != "b" || err != nil {
		t.Fatalf("Leader: %q, %v", v, err)
	}
	if err := next.Proclaim(ctx, "two\nlines"); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"leader", "-addr", srv.Addr, "broken"}, &out, &out); code != 0 || out.String() != `"two\nlines"`+"\n" {
		t.Fatalf("leader of a value with a newline: exit %d: %q; want it quoted, on one line", code, out.String())
	}
	_ = leader.Resign(ctx) // reports the loss
	if err := next.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// A key of another type is never released: elect says so at once.
	if err := srv.Client(t).HSet(ctx, "hash", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := run([]string{"elect", "-addr", srv.Addr, "hash", "--", "true"}, &out, &out); code != exitNotALock {
		t.Fatalf("elect on a hash: exit %d: %q; want %d", code, out.String(), exitNotALock)
	}
}
