package redislock

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// History checking: the hammer records every critical section, a fenced
// read-modify-write of a counter under the lock, as one operation with its
// invoke and return times, and the checker asks porcupine whether some
// order of them, consistent with real time, explains every value read.
// Mutual exclusion makes the sections sequential, so each reads what the
// last accepted write wrote; two sections that overlap both read the same
// value, and no order explains the second.

// fencedOp is one critical section: under the lock with token Token, it
// read Read from the counter of Key, and its write of Read+1, fenced with
// Token, was Accepted or refused.
type fencedOp struct {
	Key      string
	Client   int
	Token    int64
	Read     int64
	Accepted bool
	Unknown  bool  // the write's outcome is not known (it may not have run)
	Held     bool  // refused while its holder still believed it held (the nemesis)
	Call     int64 // before the read, in ns since the epoch (all processes share the clock)
	Return   int64 // after the write
}

func (o fencedOp) String() string {
	verdict := "accepted"
	if o.Unknown {
		verdict = "unknown"
	} else if !o.Accepted {
		verdict = "refused"
	}
	return fmt.Sprintf("client %d on %s, token %d: read %d, wrote %d %s, [%s, %s]", o.Client, o.Key, o.Token, o.Read, o.Read+1, verdict,
		time.Unix(0, o.Call).Format("15:04:05.000000"), time.Unix(0, o.Return).Format("15:04:05.000000"))
}

// counterState is a fenced counter: its value, and the highest token of an
// accepted write.
type counterState struct{ count, token int64 }

// fencedCounter is the sequential specification: a section reads the
// current count; its write is accepted if and only if its token is above
// every accepted one, and then sets the count to what it read plus one.
var fencedCounter = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(fencedOp).Key
			if byKey[k] == nil {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return counterState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, op := state.(counterState), input.(fencedOp)
		if op.Read != s.count {
			return false, s
		}
		if op.Token > s.token != op.Accepted {
			return false, s
		}
		if op.Accepted {
			return true, counterState{count: s.count + 1, token: op.Token}
		}
		return true, s
	},
	DescribeOperation: func(input, _ any) string { return input.(fencedOp).String() },
	DescribeState: func(state any) string {
		s := state.(counterState)
		return fmt.Sprintf("count %d, token %d", s.count, s.token)
	},
}

// checkHistory checks ops with porcupine. It returns "" when they are
// linearizable; otherwise a report of the offending operations: the
// sections of the key that overlap in time, and the first that no order
// explains, after the longest order the checker found.
func checkHistory(ops []fencedOp, timeout time.Duration) string {
	history := make([]porcupine.Operation, len(ops))
	for i, op := range ops {
		history[i] = porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: nil, Return: op.Return}
	}
	result, info := porcupine.CheckOperationsVerbose(fencedCounter, history, timeout)
	switch result {
	case porcupine.Ok:
		return ""
	case porcupine.Unknown:
		return fmt.Sprintf("history of %d operations not decided within %v", len(ops), timeout)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "history of %d operations is not linearizable:\n", len(ops))
	for _, partition := range info.PartialLinearizationsOperations() {
		longest := []porcupine.Operation(nil)
		for _, lin := range partition {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
		if len(longest) == 0 {
			continue
		}
		key := longest[0].Input.(fencedOp).Key
		var mine []fencedOp
		for _, op := range ops {
			if op.Key == key {
				mine = append(mine, op)
			}
		}
		if len(longest) == len(mine) {
			continue // this key's history is linearizable
		}
		sort.Slice(mine, func(i, j int) bool { return mine[i].Call < mine[j].Call })
		fmt.Fprintf(&b, "  key %s: %d of %d operations ordered; the last ordered ones:\n", key, len(longest), len(mine))
		for _, op := range longest[max(0, len(longest)-3):] {
			fmt.Fprintf(&b, "    %v\n", op.Input)
		}
		overlaps := 0
		for i := 0; i < len(mine) && overlaps < 10; i++ {
			for j := i + 1; j < len(mine) && mine[j].Call <= mine[i].Return; j++ {
				fmt.Fprintf(&b, "  overlapping sections:\n    %v\n    %v\n", mine[i], mine[j])
				overlaps++
			}
		}
	}
	if dir := os.Getenv("REDISLOCK_HISTORY_DIR"); dir != "" {
		path := filepath.Join(dir, "history.html")
		if err := porcupine.VisualizePath(fencedCounter, info, path); err == nil {
			fmt.Fprintf(&b, "  visualization: %s\n", path)
		}
	}
	return b.String()
}

// writeOps appends ops to path, one per line.
func writeOps(path string, ops []fencedOp) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, op := range ops {
		fmt.Fprintf(w, "%s %d %d %d %t %d %d\n", op.Key, op.Client, op.Token, op.Read, op.Accepted, op.Call, op.Return)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readOps reads the operations written by writeOps.
func readOps(path string) ([]fencedOp, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []fencedOp
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var op fencedOp
		var accepted string
		if _, err := fmt.Sscan(sc.Text(), &op.Key, &op.Client, &op.Token, &op.Read, &accepted, &op.Call, &op.Return); err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, sc.Text(), err)
		}
		op.Accepted, _ = strconv.ParseBool(accepted)
		ops = append(ops, op)
	}
	return ops, sc.Err()
}

// The checker passes a sequential history, and catches two sections that
// overlapped (both read the same count), naming them.
func TestHistoryCheckerCatchesOverlap(t *testing.T) {
	const ms = int64(time.Millisecond)
	good := []fencedOp{
		{Key: "a", Client: 0, Token: 1, Read: 0, Accepted: true, Call: 1 * ms, Return: 2 * ms},
		{Key: "a", Client: 1, Token: 2, Read: 1, Accepted: true, Call: 3 * ms, Return: 4 * ms},
		{Key: "b", Client: 2, Token: 1, Read: 0, Accepted: true, Call: 1 * ms, Return: 5 * ms},
		// A stale holder's write, refused: it read the count before the
		// next holder's write and wrote after it.
		{Key: "a", Client: 0, Token: 2, Read: 2, Accepted: false, Call: 5 * ms, Return: 6 * ms},
	}
	if report := checkHistory(good, 10*time.Second); report != "" {
		t.Fatalf("a sequential history was refused:\n%s", report)
	}
	bad := append(append([]fencedOp(nil), good[:3]...),
		fencedOp{Key: "a", Client: 3, Token: 3, Read: 2, Accepted: true, Call: 5 * ms, Return: 8 * ms},
		fencedOp{Key: "a", Client: 4, Token: 4, Read: 2, Accepted: true, Call: 6 * ms, Return: 7 * ms}, // inside client 3's section
	)
	report := checkHistory(bad, 10*time.Second)
	if report == "" {
		t.Fatal("two overlapping sections that read the same count passed the checker")
	}
	for _, want := range []string{"key a", "client 3 on a, token 3: read 2", "client 4 on a, token 4: read 2", "overlapping sections"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report does not name %q:\n%s", want, report)
		}
	}
	t.Logf("the checker's report:\n%s", report)
}
