package bench

import "testing"

// TestTargetCheckAndText: a target's check and printed form agree, at and
// around its bound.
func TestTargetCheckAndText(t *testing.T) {
	for _, tc := range []struct {
		t          target
		text       string
		pass, fail float64
	}{
		{atLeast(0.9, "").digits(2), "≥ 0.90", 0.9, 0.899},
		{atMost(1, "").digits(1), "≤ 1.0", 1, 1.01},
		{below(0.05, "%"), "< 5%", 0.0499, 0.05},
		{atMost(0.15, "%"), "≤ 15%", 0.15, 0.151},
		{atLeast(2.5, "×"), "≥ 2.5×", 2.5, 2.49},
		{atMost(1.25, ""), "≤ 1.25", 1.25, 1.26},
	} {
		if got := tc.t.String(); got != tc.text {
			t.Errorf("%+v prints %q, want %q", tc.t, got, tc.text)
		}
		if !tc.t.ok(tc.pass) || tc.t.ok(tc.fail) {
			t.Errorf("%s: ok(%v) = %v, ok(%v) = %v; want true, false", tc.text, tc.pass, tc.t.ok(tc.pass), tc.fail, tc.t.ok(tc.fail))
		}
	}
}
