package consumer

import "testing"

// TestCommitTurnsOneAtATime: a request for an early commit comes while a
// commit runs, so it waits for it; that commit ends and, before the loop
// serves the waiting request, another request comes and starts a commit
// (the manager's select picks either). The waiting request is answered by
// that commit, which reads the watermarks after the first ended: no second
// commit may start while it runs. Before, the request that started it left
// the waiting one set, and the loop started another commit beside it.
func TestCommitTurnsOneAtATime(t *testing.T) {
	t.Parallel()
	var started []chan struct{}
	start := func() <-chan struct{} {
		for i, ch := range started {
			select {
			case <-ch:
			default:
				t.Fatalf("commit %d started while commit %d runs", len(started)+1, i+1)
			}
		}
		ch := make(chan struct{})
		started = append(started, ch)
		return ch
	}
	// serve is one pass of the loop's select over again alone.
	serve := func(turns *commitTurns) {
		select {
		case <-turns.again:
			turns.follow(start)
		default:
		}
	}
	turns := newCommitTurns()
	turns.request(start) // commit 1
	turns.request(start) // waits for commit 1
	close(started[0])
	turns.request(start) // commit 2, which answers the waiting one too
	serve(&turns)
	if len(started) != 2 {
		t.Fatalf("%d commits started, want 2", len(started))
	}
	close(started[1])
	serve(&turns)
	turns.tick(start) // commit 3, nothing running
	turns.request(start)
	turns.tick(start) // commit 3 still runs: nothing starts
	close(started[2])
	serve(&turns) // commit 4, the waiting request
	if len(started) != 4 {
		t.Fatalf("%d commits started, want 4", len(started))
	}
}
