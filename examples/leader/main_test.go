package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/zeromicro/go-zero/core/stores/redis"

	"github.com/redislock/redislock/internal/redisserver"
)

// TestMain runs main instead of the tests in a replica process.
func TestMain(m *testing.M) {
	if os.Getenv("LEADER_REPLICA") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

var (
	leadingLine = regexp.MustCompile(`^(\w+): leading, term (\d+)$`)
	runLine     = regexp.MustCompile(`^(\w+): job run \d+ in term (\d+)$`)
	endLine     = regexp.MustCompile(`^(\w+): (resigning|no longer leading)`)
)

// checkTerms checks a run's output: the job runs only in the term of the
// replica that leads, between its "leading" line and its end, one term
// after the other, each term's number above the last. It returns the
// replicas that led, in order.
func checkTerms(t *testing.T, out string) []string {
	t.Helper()
	var led []string
	var term int64
	leader := "" // none between terms
	for _, line := range strings.Split(out, "\n") {
		if m := leadingLine.FindStringSubmatch(line); m != nil {
			n, _ := strconv.ParseInt(m[2], 10, 64)
			if leader != "" || n <= term {
				t.Errorf("%q: a term while %q leads, or not above %d", line, leader, term)
			}
			leader, term = m[1], n
			led = append(led, m[1])
		}
		if m := runLine.FindStringSubmatch(line); m != nil && (m[1] != leader || m[2] != strconv.FormatInt(term, 10)) {
			t.Errorf("%q: a run outside the term of %q (%d)", line, leader, term)
		}
		if m := endLine.FindStringSubmatch(line); m != nil {
			if m[1] != leader {
				t.Errorf("%q: the end of a term of %q", line, leader)
			}
			leader = ""
		}
	}
	return led
}

// The demo: each replica leads once, for its three runs, and the terms
// follow each other.
func TestDemo(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.ClockTTL(true)
	var out syncBuffer
	demo(context.Background(), config{key: "report-job", every: 20 * time.Millisecond, lease: time.Second, runs: 3},
		redis.MustNewRedis(redis.RedisConf{Host: mr.Addr(), Type: redis.NodeType, NonBlock: true, DisableIdentity: true}), &out)
	led := checkTerms(t, out.String())
	if len(led) != 3 || strings.Count(out.String(), "job run") != 9 || strings.Contains(out.String(), "resign failed") || !strings.Contains(out.String(), "every replica led") {
		t.Fatalf("want a, b and c to lead in turn for 3 runs each; led %v:\n%s", led, out.String())
	}
}

// Three replica processes on a real server: the leader serves who leads
// over HTTP as the others do; SIGKILLed, its job moves to another replica
// once its lease runs out, in a later term, and the survivors report the
// new leader.
func TestKilledLeaderJobMoves(t *testing.T) {
	srv := redisserver.Start(t)
	var out syncBuffer
	procs := map[string]*exec.Cmd{}
	for _, name := range []string{"r1", "r2", "r3"} {
		cmd := exec.Command(os.Args[0], "-addr", srv.Addr, "-name", name, "-every", "50ms", "-lease", "1s", "-http", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "LEADER_REPLICA=1")
		cmd.Stdout, cmd.Stderr = &out, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		procs[name] = cmd
	}
	first := waitFor(t, &out, leadingLine, 0)[1]
	waitFor(t, &out, regexp.MustCompile(`^`+first+`: job run 2 `), 0)
	for name := range procs { // every replica says who leads
		addr := waitFor(t, &out, regexp.MustCompile(`^`+name+`: serving GET /leader on (\S+)$`), 0)[1]
		resp, err := http.Get("http://" + addr + "/leader")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := strings.TrimSpace(string(body)); got != first {
			t.Errorf("%s says %q leads, want %q", name, got, first)
		}
	}
	if err := procs[first].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	_ = procs[first].Wait()
	from := strings.Count(out.String(), "\n")
	next := waitFor(t, &out, leadingLine, from)[1]
	t.Logf("%s led %v after %s was SIGKILLed (lease 1s, a renewal every 333ms)", next, time.Since(killedAt).Round(time.Millisecond), first)
	waitFor(t, &out, regexp.MustCompile(`^`+next+`: job run 1 `), from)
	for name := range procs {
		if name != first {
			waitFor(t, &out, regexp.MustCompile(fmt.Sprintf(`^%s: leader is "%s"$`, name, next)), from)
		}
	}
	if next == first {
		t.Fatalf("the killed replica %s leads again", first)
	}
	lines := strings.SplitAfter(out.String(), "\n")
	killed := strings.Join(lines[:from], "") + first + ": no longer leading: killed\n" + strings.Join(lines[from:], "")
	if led := checkTerms(t, killed); len(led) != 2 {
		t.Fatalf("want 2 terms, got %v:\n%s", led, out.String())
	}
}

// waitFor waits (30 s at most) for a line of out, after its first from
// lines, that re matches, and returns the match.
func waitFor(t *testing.T, out *syncBuffer, re *regexp.Regexp, from int) []string {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		sc := bufio.NewScanner(strings.NewReader(out.String()))
		for i := 0; sc.Scan(); i++ {
			if m := re.FindStringSubmatch(sc.Text()); i >= from && m != nil {
				return m
			}
		}
	}
	t.Fatalf("no line matching %s:\n%s", re, out.String())
	return nil
}

// syncBuffer is an io.Writer that tests read while replicas write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
