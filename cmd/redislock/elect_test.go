package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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
