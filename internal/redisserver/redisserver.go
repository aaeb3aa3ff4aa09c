// Package redisserver starts real redis-server processes on loopback ports
// for tests and benchmarks; with REDISLOCK_SERVER=valkey, Valkey's instead
// (valkey-server, valkey-cli, valkey-sentinel).
//
// A binary that is missing skips the test with a message saying what to
// install, except when the CI environment variable is set: then it fails.
package redisserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process that a test started.
type Server struct {
	Addr string
	Port int
	bin  string
	args []string // everything redis-server was started with
	cmd  *exec.Cmd
	log  *bytes.Buffer
	done chan struct{}
}

// Name returns the name of the server the tests start: "redis-server", or
// "valkey-server" under REDISLOCK_SERVER=valkey.
func Name() string {
	if os.Getenv("REDISLOCK_SERVER") == "valkey" {
		return "valkey-server"
	}
	return "redis-server"
}

// Binary returns the path of the named binary (redis-server, redis-cli,
// redis-sentinel), or of Valkey's under REDISLOCK_SERVER=valkey, skipping
// tb when it is missing, or failing it under CI.
func Binary(tb testing.TB, name string) string {
	tb.Helper()
	install := "apt-get install redis-server redis-tools redis-sentinel"
	switch kind := os.Getenv("REDISLOCK_SERVER"); kind {
	case "", "redis":
	case "valkey":
		name = "valkey-" + strings.TrimPrefix(name, "redis-")
		install = "apt-get install -t bookworm-backports valkey-server valkey-tools valkey-sentinel"
	default:
		tb.Fatalf("REDISLOCK_SERVER=%q: want redis or valkey", kind)
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s not found in PATH: install it (Debian: %s) to run this test", name, install)
	if os.Getenv("CI") != "" {
		tb.Fatal(msg + " (CI is set, so this fails instead of skipping)")
	}
	tb.Skip(msg)
	return ""
}

// Start starts a redis-server without persistence on a free loopback port,
// with the DEBUG command enabled, and stops it when tb's test ends. args are
// more redis-server options, such as "--appendonly", "yes".
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	bin := Binary(tb, "redis-server")
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind
		s, err := start(bin, tb.TempDir(), args)
		if err == nil {
			tb.Cleanup(func() { s.Stop() })
			return s
		}
		lastErr = err
	}
	tb.Fatalf("redisserver: %v", lastErr)
	return nil
}

func start(bin, dir string, args []string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	all := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--save", "", "--appendonly", "no",
		"--enable-debug-command", "yes", "--daemonize", "no",
		"--repl-diskless-sync-delay", "0", // a replica syncs at once, not after 5 s
	}, args...)
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, bin: bin, args: all}
	if err := s.run(); err != nil {
		return nil, err
	}
	return s, nil
}

// run starts the process and waits until it answers PING.
func (s *Server) run() error { return s.runUntil(false) }

// runUntil starts the process and waits until it answers PING, or with
// loading until it answers anything, LOADING included.
func (s *Server) runUntil(loading bool) error {
	s.log, s.done = &bytes.Buffer{}, make(chan struct{})
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = procAttr()
	if err := s.cmd.Start(); err != nil {
		return err
	}
	done := s.done
	go func() { _ = s.cmd.Wait(); close(done) }()
	if err := s.waitReady(10*time.Second, loading); err != nil {
		s.Stop()
		return fmt.Errorf("redis-server on %s: %w\n%s", s.Addr, err, s.log.String())
	}
	return nil
}

// Restart kills the server (as a crash would: no shutdown save) and starts
// it again on the same port, with the same data directory and options.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Stop()
	if err := s.run(); err != nil {
		tb.Fatalf("redisserver: restart: %v", err)
	}
}

// RestartLoading is Restart, returning as soon as the server answers, while
// it may still be loading its data (and replying LOADING).
func (s *Server) RestartLoading(tb testing.TB) {
	tb.Helper()
	s.Stop()
	if err := s.runUntil(true); err != nil {
		tb.Fatalf("redisserver: restart: %v", err)
	}
}

// waitReady waits until the server answers, and checks that the server
// answering is the process s started: another process's server can take
// the port between FreePort and the bind, and answer instead (ours then
// exits, unable to bind).
func (s *Server) waitReady(within time.Duration, loading bool) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil || loading && err != nil && strings.HasPrefix(err.Error(), "LOADING") {
			return s.isOurs(c)
		}
		select {
		case <-s.done:
			return fmt.Errorf("exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// isOurs checks that the server c talks to is the process s started, by
// the process_id of its INFO server (which a loading server answers too).
func (s *Server) isOurs(c *redis.Client) error {
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return fmt.Errorf("INFO server: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if pid, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if pid != strconv.Itoa(s.cmd.Process.Pid) {
				return fmt.Errorf("%w: process %s answers on %s, not %d, which was started", ErrNotOurs, pid, s.Addr, s.cmd.Process.Pid)
			}
			return nil
		}
	}
	return fmt.Errorf("INFO server without process_id: %.200q", info)
}

// ErrNotOurs reports a server on a test's port that the test did not start.
var ErrNotOurs = errors.New("redisserver: another process's server answers")

// Signal sends sig to the server's process: SIGSTOP pauses it, as a
// stalled machine, and SIGCONT resumes it.
func (s *Server) Signal(tb testing.TB, sig os.Signal) {
	tb.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("redisserver: %v to %s: %v", sig, s.Addr, err)
	}
}

// WaitReplicas waits until the server, a primary, counts n replicas
// online, and n of them acknowledge a write within 200 ms (a replica just
// online may acknowledge its first writes late).
func (s *Server) WaitReplicas(tb testing.TB, n int) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, _ := c.Info(context.Background(), "replication").Result()
		// Online, and acknowledging: a replica just online may not yet
		// acknowledge the first writes in time.
		if strings.Count(info, "state=online") >= n && writeNothing(c) {
			if acked, _ := c.Do(context.Background(), "WAIT", n, 200).Int(); acked >= n {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redisserver: %s has not %d replicas online: %s", s.Addr, n, info)
		}
	}
}

// writeNothing makes a write that WAIT can wait for and that leaves no
// key: a key set and deleted, in one of the server's slots when it is a
// Cluster node.
func writeNothing(c *redis.Client) bool {
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		key := "redisserver:replicated:" + strconv.Itoa(i)
		switch err := c.Set(ctx, key, "", 0).Err(); {
		case err == nil:
			return c.Del(ctx, key).Err() == nil
		case !strings.HasPrefix(err.Error(), "MOVED"):
			return false
		}
	}
	return false
}

// Client returns a new go-redis client of the server, closed when tb's test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server and waits for it to exit. It may be called more than once.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
	}
	<-s.done
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartSentinel starts a redis-sentinel on a free loopback port that
// monitors the primary at masterAddr as masterName, with a quorum of one,
// down-after-milliseconds 1000 and failover-timeout 10000, then the lines
// of conf, which may set them again. It needs redis-sentinel.
func StartSentinel(tb testing.TB, masterName, masterAddr string, conf ...string) *Server {
	tb.Helper()
	bin := Binary(tb, "redis-sentinel")
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		tb.Fatal(err)
	}
	var lastErr error
	for range 5 {
		p, err := FreePort()
		if err != nil {
			tb.Fatal(err)
		}
		dir := tb.TempDir()
		path := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
			"sentinel monitor %s %s %s 1\n"+
			"sentinel down-after-milliseconds %s 1000\n"+
			"sentinel failover-timeout %s 10000\n",
			p, dir, masterName, host, port, masterName, masterName)
		for _, line := range conf {
			text += line + "\n"
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			tb.Fatal(err)
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(p), Port: p, bin: bin, args: []string{path}}
		if lastErr = s.run(); lastErr == nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("redisserver: sentinel: %v", lastErr)
	return nil
}
