package redisserver

import (
	"errors"
	"strconv"
	"testing"
)

// A server started on a port that another process's server holds does not
// pass for ours: its process exits, unable to bind, while the other one
// answers PING on the port.
func TestServerOnATakenPortIsNotOurs(t *testing.T) {
	other := Start(t)
	bin := Binary(t, "redis-server")
	s := &Server{Addr: other.Addr, Port: other.Port, bin: bin, args: []string{
		"--port", strconv.Itoa(other.Port), "--bind", "127.0.0.1", "--dir", t.TempDir(), "--save", "", "--appendonly", "no",
	}}
	err := s.run()
	if !errors.Is(err, ErrNotOurs) {
		t.Fatalf("started on %s, which another server holds: %v", other.Addr, err)
	}
	// Ours, on a free port, is ours.
	if err := Start(t).isOurs(other.Client(t)); !errors.Is(err, ErrNotOurs) {
		t.Fatalf("another server's client passed for ours: %v", err)
	}
	if err := other.isOurs(other.Client(t)); err != nil {
		t.Fatalf("the server's own client: %v", err)
	}
}
