//go:build linux && cgo

package model

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/ortenv"
)

// arenaChild marks the fresh process TestMallocOneArenaForEveryThread runs
// itself in.
const arenaChild = "SCORER_TEST_MALLOC_ARENA_CHILD"

var arenasLine = regexp.MustCompile(`(?m)^malloc arenas: (-?\d+) threads: (\d+)$`)

// TestMallocOneArenaForEveryThread counts the glibc malloc arenas of a
// process that did what the scorer does (Go's runtime starts its threads,
// InitRuntime, a session, runs on several OS threads at once): there must be
// one. Go's runtime allocates from C on every thread that starts another
// (cgo's thread start), before main, so a cap set only at InitRuntime left
// those threads' arenas in use, and ORT's threads were then spread over them.
//
// It runs in a fresh process without glibc's malloc variables, so what it
// sees is what the binary does by itself, not what an image's or a
// developer's environment adds.
func TestMallocOneArenaForEveryThread(t *testing.T) {
	if os.Getenv(arenaChild) == "1" {
		mallocArenaChild(t)
		return
	}
	if _, ok := ortenv.MallocArenas(); !ok {
		t.Skip("not glibc: no malloc arenas to count")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMallocOneArenaForEveryThread$", "-test.count=1", "-test.v")
	for _, kv := range os.Environ() {
		// MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_ and the like, and the
		// tunables they are aliases of.
		if !strings.HasPrefix(kv, "MALLOC_") && !strings.HasPrefix(kv, "GLIBC_TUNABLES=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, arenaChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child process: %v\n%s", err, testenv.Tail(string(out), 4000))
	}
	m := arenasLine.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("child printed no arena count:\n%s", testenv.Tail(string(out), 4000))
	}
	arenas, _ := strconv.Atoi(m[1])
	threads, _ := strconv.Atoi(m[2])
	if threads < 4 {
		t.Fatalf("child ran %d threads; the check needs several", threads)
	}
	t.Logf("%d malloc arena(s), %d threads", arenas, threads)
	if arenas != 1 {
		t.Errorf("%d glibc malloc arenas in a process of %d threads, want 1", arenas, threads)
	}
}

// mallocArenaChild scores from four goroutines, each locked to its own OS
// thread, with a session of its own threads, then prints the arena count.
func mallocArenaChild(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, testenv.ProductionArch))
	s := newSession(t, m)
	pair, err := m.EncodeText("Revenue grew ten percent on strong demand for consumables.", "This text is about growth.")
	if err != nil {
		t.Fatal(err)
	}
	pairs := []Pair{pair, pair, pair, pair}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for range 3 {
				if _, err := s.ScorePairs(context.Background(), pairs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	arenas, _ := ortenv.MallocArenas()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("malloc arenas: %d threads: %d\n", arenas, len(tasks))
}
