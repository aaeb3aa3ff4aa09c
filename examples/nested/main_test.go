package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/redislock/redislock/internal/redisserver"
)

// TestRun runs both versions on a real redis-server.
func TestRun(t *testing.T) {
	srv := redisserver.Start(t)
	var out bytes.Buffer
	res, err := run(context.Background(), srv.Client(t), &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	check(t, res, out.String())
	for _, acct := range []string{"alice", "bob"} {
		if n := srv.Client(t).Exists(context.Background(), keyPrefix+"account:"+acct).Val(); n != 0 {
			t.Errorf("%s's lock is still held", acct)
		}
	}
}

// TestDemo runs the program's path: demo on an embedded miniredis, as main
// does without -addr.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	res, err := demo(context.Background(), "", &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, &out)
	}
	check(t, res, out.String())
}

// check asserts what both versions must have seen.
func check(t *testing.T, res result, out string) {
	t.Helper()
	w, r := res.Wrong, res.Right

	// Wrong: the second worker's Close re-entered the first one's hold
	// (holds 2, then 2+2), so both were inside Withdraw at once, both read
	// the full balance, and both paid it out.
	if !w.Overlap {
		t.Error("wrong version: no overlap observed")
	}
	if !slices.Equal(w.Holds, []int{2, 4}) {
		t.Errorf("wrong version: holds inside Withdraw %v, want [2 4]", w.Holds)
	}
	if w.Errs != [2]error{} || w.Paid != [2]int64{opening, opening} || w.Balance != -opening {
		t.Errorf("wrong version: errors %v, paid %v, balance %d; want no errors, paid [%d %d], balance %d",
			w.Errs, w.Paid, w.Balance, opening, opening, -opening)
	}

	// Right: the second worker waited for the first one's lock, then found
	// the account closed.
	if r.Overlap {
		t.Error("right version: overlap observed")
	}
	if !slices.Equal(r.Holds, []int{2}) {
		t.Errorf("right version: holds inside Withdraw %v, want [2]", r.Holds)
	}
	if r.Errs[0] != nil || !errors.Is(r.Errs[1], ErrClosed) {
		t.Errorf("right version: errors %v, want [nil %v]", r.Errs, ErrClosed)
	}
	if r.Paid != [2]int64{opening, 0} || r.Balance != 0 {
		t.Errorf("right version: paid %v, balance %d; want [%d 0], 0", r.Paid, r.Balance, opening)
	}

	for _, line := range []string{
		"=> both inside at once; alice: paid out 200 of 100, balance -100",
		"=> never both inside; bob: paid out 100 of 100, balance 0",
		"worker 2: account closed",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("output lacks %q:\n%s", line, out)
		}
	}
}
