package main

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/redislock/redislock/internal/redisserver"
)

func TestMain(m *testing.M) {
	if os.Getenv("REDISLOCK_CLI") == "1" { // the tests run the binary as the command
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/zeromicro/go-zero/core/proc.init.1.func1"),
		goleak.IgnoreTopFunction("github.com/zeromicro/go-zero/core/stat.init.1.func1"),
	)
}

// demoOutcomes are lines each scene of the demo prints only when the lock
// behaved as the scene says.
var demoOutcomes = []string{
	"worker-1 releases it.", "worker-2 releases it.", "worker-3 releases it.",
	"Holds() = 2",
	"released once: Holds() = 1, key still there: true, a different RedisLock gets it: false",
	"released the outer hold: Holds() = 0, key still there: false",
	"Release() = true, <nil>",
	"errors.Is(err, redislock.ErrLockLost) = true",
	"The next run acquires it: true, <nil>",
	"fn sees its context end (service shutting down) and returns; Do releases the lock.",
	"Do() = <nil>; key still there: false",
	"renewal stops, Done() still open: true, key still there: true",
	"then Done() closed, Err() = redislock: \"redislock-demo:report:weekly\": the lease ran out after the holding context ended: request finished",
	"the late Release() = false, redislock: \"redislock-demo:report:weekly\": the lease ran out after the holding context ended: request finished",
	"That's the tour.",
}

func checkDemo(t *testing.T, args ...string) {
	var out, errOut lockedBuffer
	if code := run(append([]string{"demo", "-fast"}, args...), &out, &errOut); code != 0 {
		t.Fatalf("demo exited %d: %s\n%s", code, errOut.String(), out.String())
	}
	for _, want := range demoOutcomes {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if err := takeTurns(out.String()); err != nil {
		t.Error(err)
	}
	if t.Failed() {
		t.Log(out.String())
	}
}

// takeTurns checks that in the demo's first scene every worker's
// "acquired" is followed by its own "releases" before anyone acquires.
func takeTurns(out string) error {
	holder, turns := "", 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[1], "worker-") {
			continue
		}
		switch w, event := f[1], f[2]; event {
		case "acquired":
			if holder != "" {
				return fmt.Errorf("%s acquired while %s held the lock", w, holder)
			}
			holder = w
		case "releases":
			if holder != w {
				return fmt.Errorf("%s released while %q held the lock", w, holder)
			}
			holder = ""
			turns++
		}
	}
	if turns != 3 {
		return fmt.Errorf("%d turns, want 3", turns)
	}
	return nil
}

func TestDemoEmbedded(t *testing.T) { checkDemo(t) }

func TestDemoRealRedis(t *testing.T) {
	srv := redisserver.Start(t)
	checkDemo(t, "-addr", srv.Addr)
}

func TestUsage(t *testing.T) {
	var out, errOut lockedBuffer
	if code := run(nil, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "usage") {
		t.Fatalf("no args: %d %q", code, errOut.String())
	}
	if code := run([]string{"nope"}, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), `unknown command "nope"`) {
		t.Fatalf("unknown command: %d %q", code, errOut.String())
	}
	if code := run([]string{"demo", "-addr", "127.0.0.1:1"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "cannot reach Redis") {
		t.Fatalf("unreachable Redis: %d %q", code, errOut.String())
	}
}
