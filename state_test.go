package redislock

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageLevelState: no package of the core keeps mutable state at
// package level but the default Lockers' registry (weakly keyed) and
// keyslot's memo. Every other package-level var is set once and only read:
// an error, a script, a metric, a closed channel. A new var must be added
// here, with its reason.
func TestPackageLevelState(t *testing.T) {
	allowed := map[string]string{
		"./defaultLockers":   "the registry of default Lockers, weakly keyed",
		"./closedChan":       "a closed channel",
		"./DefaultRetry":     "the exported default strategy, a value",
		"./labelSets":        "the memo of the metrics' label values, one per kind and prefix",
		"./logxLogger":       "the slog logger over go-zero's logx, which holds nothing",
		"./plainMode":        "a lock's kind: its scripts",
		"./fairMode":         "a fair lock's kind: its scripts",
		"./permitMode":       "a semaphore's or a shared lock's kind: its scripts",
		"internal/store/lua": "the embedded scripts",
		"internal/store/replicated": "the memo of scripts followed by WAIT: one per script and Replicas, so that " +
			"the renewals of locks alike share a script call",
		"internal/wake/closed":  "a closed channel",
		"internal/keyslot/tags": "keyslot's memo of hash tags",
	}
	immutable := func(dir, name string) bool {
		switch {
		case strings.HasPrefix(name, "Err"), strings.HasPrefix(name, "err"): // errors
		case strings.HasPrefix(name, "metric"): // go-zero's metric vectors
		case dir == "internal/store" && strings.ToUpper(name[:1]) == name[:1]: // the scripts
		default:
			return false
		}
		return true
	}
	seen := 0
	for _, dir := range []string{".", "internal/clock", "internal/store", "internal/renew", "internal/wake", "internal/keyslot"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range file.Decls {
				g, ok := d.(*ast.GenDecl)
				if !ok || g.Tok != token.VAR {
					continue
				}
				for _, sp := range g.Specs {
					for _, n := range sp.(*ast.ValueSpec).Names {
						seen++
						if _, ok := allowed[dir+"/"+n.Name]; !ok && !immutable(dir, n.Name) {
							t.Errorf("%s: package-level var %s is not on the list", f, n.Name)
						}
					}
				}
			}
		}
	}
	if seen < 20 {
		t.Fatalf("only %d package-level vars found: the files were not read", seen)
	}
}
