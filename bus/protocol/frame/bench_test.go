package frame

import (
	"fmt"
	"io"
	"testing"
)

// loopReader replays data forever, as a busy connection would.
type loopReader struct {
	data []byte
	off  int
}

func (l *loopReader) Read(p []byte) (int, error) {
	n := copy(p, l.data[l.off:])
	l.off = (l.off + n) % len(l.data)
	return n, nil
}

func BenchmarkRead(b *testing.B) {
	for _, size := range []int{16, 64, 256, 1024} {
		b.Run(fmt.Sprintf("Payload%d", size), func(b *testing.B) {
			payload := make([]byte, size)
			var block []byte
			for len(block) < 64<<10 { // whole frames, so the loop stays aligned
				block, _ = Append(block, payload)
			}
			r := NewReader(&loopReader{data: block})
			b.SetBytes(int64(headerSize + size))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkWrite(b *testing.B) {
	payload := make([]byte, 64)
	b.SetBytes(int64(headerSize + len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Write(io.Discard, payload); err != nil {
			b.Fatal(err)
		}
	}
}
