package coordinator

import (
	"testing"
	"time"

	"github.com/jobbus/jobbus/bus/protocol"
)

func TestLimiterTypeAndQueue(t *testing.T) {
	t.Parallel()
	t0 := time.UnixMilli(1_700_000_000_000)
	l := newLimiter()
	if ok, _ := l.admits("", "SLEEP", t0); !ok {
		t.Fatal("no limit set, yet a start was refused")
	}
	l.set(protocol.LimitTaskType, "SLEEP", protocol.Rate{Count: 10, Period: time.Second}, 2, 1, true, t0)
	l.set(protocol.LimitQueue, "default", protocol.Rate{Count: 1, Period: time.Second}, 1, 2, true, t0)

	// The default queue (queue "") has one token, SLEEP two: one start, then the queue's
	// limit holds both back.
	if ok, _ := l.admits("", "SLEEP", t0); !ok {
		t.Fatal("first start refused")
	}
	l.started("", "SLEEP", t0)
	ok, next := l.admits("", "SLEEP", t0)
	if ok || !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("second start: admits = %v, next +%v; want refused until the queue's token at +1s", ok, next.Sub(t0))
	}
	// Another queue is held back by SLEEP's limit only, which has a token left.
	if ok, _ := l.admits("critical", "SLEEP", t0); !ok {
		t.Fatal("a job of another queue refused while its type has a token")
	}
	l.started("critical", "SLEEP", t0)
	ok, next = l.admits("critical", "SLEEP", t0)
	if ok || !next.Equal(t0.Add(100*time.Millisecond)) {
		t.Fatalf("type's bucket empty: admits = %v, next +%v; want +100ms", ok, next.Sub(t0))
	}
	// Both refuse: the later token is when both have one.
	ok, next = l.admits("", "SLEEP", t0)
	if ok || !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("both empty: next +%v, want +1s", next.Sub(t0))
	}

	t1 := t0.Add(time.Second)
	if ok, _ := l.admits("", "SLEEP", t1); !ok {
		t.Fatal("refused at +1s though both buckets have a token")
	}
	l.started("", "SLEEP", t1)
	infos := l.list(t1)
	if len(infos) != 2 || infos[0].Scope != protocol.LimitQueue || infos[1].Scope != protocol.LimitTaskType {
		t.Fatalf("list = %+v, want the queue's limit then the type's", infos)
	}
	if q := infos[0]; q.Throttled != 1 || q.Tokens != 0 || q.NextTokenMillis != t1.Add(time.Second).UnixMilli() || q.Rate != "1/s" {
		t.Fatalf("queue limit state = %+v, want 1 throttled start, no token, the next at +2s", q)
	}
	if ty := infos[1]; ty.Throttled != 1 || ty.Burst != 2 || ty.PerSecond != 10 {
		t.Fatalf("type limit state = %+v, want 1 throttled start, burst 2, 10/s", ty)
	}

	l.remove(protocol.LimitQueue, "default")
	l.remove(protocol.LimitTaskType, "SLEEP")
	if ok, _ := l.admits("", "SLEEP", t1); !ok || !l.empty() {
		t.Fatal("limits removed, yet a start is refused")
	}
}

// BenchmarkLimiter is what dispatch pays per start: admits and started, without a
// limit (the common case) and with a limit on the type and one on the queue that do
// not bind.
func BenchmarkLimiter(b *testing.B) {
	t0 := time.UnixMilli(1_700_000_000_000)
	for _, limited := range []bool{false, true} {
		name := "none"
		if limited {
			name = "type+queue"
		}
		b.Run(name, func(b *testing.B) {
			l := newLimiter()
			if limited {
				huge := protocol.Rate{Count: protocol.MaxLimitCount, Period: time.Millisecond}
				l.set(protocol.LimitTaskType, "SHA256", huge, protocol.MaxLimitBurst, 1, true, t0)
				l.set(protocol.LimitQueue, "default", huge, protocol.MaxLimitBurst, 2, true, t0)
			}
			for i := range b.N {
				now := t0.Add(time.Duration(i) * time.Microsecond)
				if ok, _ := l.admits("", "SHA256", now); !ok {
					b.Fatal("a limit that does not bind refused a start")
				}
				l.started("", "SHA256", now)
			}
		})
	}
}
