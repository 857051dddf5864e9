package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBackoffDoublesUpToItsBound(t *testing.T) {
	b := New(100*time.Millisecond, time.Second)
	var got []time.Duration
	for range 6 {
		got = append(got, b.Pause())
		if d := b.next(); d != got[len(got)-1] {
			t.Fatalf("unjittered pause %v, announced %v", d, got[len(got)-1])
		}
	}
	want := []time.Duration{100e6, 200e6, 400e6, 800e6, time.Second, time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("pauses %v, want %v", got, want)
		}
	}
	b.Reset()
	if b.Pause() != 100*time.Millisecond {
		t.Fatalf("after Reset the pause is %v, want the first one", b.Pause())
	}
}

func TestJitteredPausesSpreadAroundTheNominalOne(t *testing.T) {
	const nominal = time.Second
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 2000 {
		b := Jittered(nominal, nominal)
		d := b.next()
		if d < nominal/2 || d >= nominal*3/2 {
			t.Fatalf("jittered pause %v outside [%v, %v)", d, nominal/2, nominal*3/2)
		}
		lo, hi = min(lo, d), max(hi, d)
	}
	// 2000 draws from a uniform second: the spread covers most of it.
	if hi-lo < 900*time.Millisecond {
		t.Fatalf("jittered pauses span only %v..%v: no jitter", lo, hi)
	}
}

var errBroken = errors.New("broken")

func TestDoStopsAtTheBoundOnAPermanentErrorOrOnSuccess(t *testing.T) {
	ctx := context.Background()
	never := func(error) bool { return false }
	for _, tc := range []struct {
		name      string
		tries     int
		failFor   int // tries that fail before one succeeds
		permanent func(error) bool
		wantCalls int
		wantErr   error
	}{
		{"bounded", 3, 10, never, 3, errBroken},
		{"succeeds", 3, 2, never, 3, nil},
		{"permanent", 3, 10, func(err error) bool { return errors.Is(err, errBroken) }, 1, errBroken},
		{"unbounded", 0, 7, never, 8, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls, announced := 0, 0
			err := Do(ctx, New(time.Microsecond, time.Microsecond), tc.tries, tc.permanent,
				func(try int, err error) {
					announced++
					if try != calls || !errors.Is(err, errBroken) {
						t.Errorf("retrying(%d, %v) after %d calls", try, err, calls)
					}
				},
				func() error {
					calls++
					if calls <= tc.failFor {
						return errBroken
					}
					return nil
				})
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("%d calls, err %v; want %d calls, err %v", calls, err, tc.wantCalls, tc.wantErr)
			}
			if announced != calls-1 {
				t.Fatalf("%d retries announced for %d calls", announced, calls)
			}
		})
	}
}

func TestDoStopsWhenTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	// The pause is an hour: only the cancel can end it.
	err := Do(ctx, New(time.Hour, time.Hour), 0, func(error) bool { return false },
		func(int, error) { cancel() },
		func() error { calls++; return errBroken })
	if calls != 1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("%d calls, err %v; want 1 call and context.Canceled", calls, err)
	}

	// A try that fails because ctx ended is not retried, and its own error
	// comes back.
	ctx, cancel = context.WithCancel(context.Background())
	calls = 0
	err = Do(ctx, New(time.Microsecond, time.Microsecond), 0, func(error) bool { return false }, nil,
		func() error { calls++; cancel(); return errBroken })
	if calls != 1 || !errors.Is(err, errBroken) {
		t.Fatalf("%d calls, err %v; want 1 call and the try's error", calls, err)
	}
}
