package consumer

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestTruncatedBeforeAnythingConsumed: the group committed 50, and a member
// starts on the partition while nobody writes to it, so its fetch client
// has consumed nothing when an unclean leader election cuts the log back to
// 40. Left to franz-go, OFFSET_OUT_OF_RANGE on a cursor that has consumed
// nothing lists ConsumeResetOffset (the log start by default), raises no
// ErrDataLoss, and the whole retained log is scored and published again,
// uncounted, whatever KAFKA_START_OFFSET says. The reset point must be
// exact: the log end (40), counted as an offset reset, committed at once,
// and the records written at 40 on scored once each. For both start-offset
// policies: neither names the log start for a truncated position.
func TestTruncatedBeforeAnythingConsumed(t *testing.T) {
	t.Parallel()
	for name, startOffset := range map[string]int64{"earliest": kafka.FirstOffset, "latest": kafka.LastOffset} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			topic, group := "truncated-unread-"+name, "g-truncated-unread-"+name
			_, brokers, armed, grown := truncatedIdleAt50(t, topic)
			commitOffset(t, brokers, group, topic, 50)
			sk := &fakeSink{}
			cfg := testConfig(brokers, topic, group)
			cfg.StartOffset = startOffset
			r := start(t, cfg, &fakeScorer{}, sk, testHooks{})
			close(armed)

			eventually(t, 20*time.Second, "the cut counted as an offset reset", func() bool { return r.c.Stats().OffsetResets >= 1 })
			eventually(t, 10*time.Second, "the commit back at 40, the log end after the cut", func() bool {
				return committed(t, brokers, group, topic, 1)[0] == 40
			})
			// A fetch or two from wherever the reader went.
			time.Sleep(500 * time.Millisecond)
			if n := len(sk.Published()); n != 0 {
				t.Fatalf("%d records published after the cut to 40 with 50 committed (first %s); want none: every record below 40 was scored before", n, sk.Published()[0].CallID)
			}
			close(grown)
			eventually(t, 20*time.Second, "the records at 40 to 49 scored", func() bool { return len(countIDs(sk.Published())) == 10 })
			eventually(t, 10*time.Second, "committed to the log end", func() bool { return committed(t, brokers, group, topic, 1)[0] == 50 })
			for id, n := range countIDs(sk.Published()) {
				if n != 1 {
					t.Errorf("%s published %d times, want once", id, n)
				}
			}
			for i, id := range callIDs("old", 40) {
				if countIDs(sk.Published())[id] != 0 {
					t.Errorf("old-%d (%s), below the cut, published again", i, id)
				}
			}
		})
	}
}
