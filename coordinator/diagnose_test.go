package coordinator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobbus/jobbus/embeddednats"
	"github.com/jobbus/jobbus/internal/testkit"
)

// checkDiagnosis holds a diagnosis to its condition and words: only a disk's condition
// speaks of a disk.
func checkDiagnosis(t *testing.T, d diagnosis, cond storeCondition, words ...string) {
	t.Helper()
	text := d.String()
	if d.cond != cond {
		t.Errorf("condition %d (%q), want %d", d.cond, text, cond)
	}
	for _, w := range words {
		if !strings.Contains(text, w) {
			t.Errorf("%q does not say %q", text, w)
		}
	}
	if strings.Contains(text, "disk") != d.disk() {
		t.Errorf("%q: speaks of a disk: %v, a disk's condition: %v", text, !d.disk(), d.disk())
	}
}

// loneServer starts a single embedded server with opts and connects to it.
func loneServer(t *testing.T, opts ...embeddednats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, err := embeddednats.Start(context.Background(), append([]embeddednats.Option{
		embeddednats.WithListen("127.0.0.1:-1"), embeddednats.WithStoreDir(t.TempDir())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// TestDiagnosisOfALoneServer: what a write's failure on a single server says, from the
// errors the server gives where a test can provoke them.
func TestDiagnosisOfALoneServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc, js := loneServer(t, embeddednats.WithJetStreamLimits(0, 1<<20))
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage, MaxMsgSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()

	t.Run("StoreFull", func(t *testing.T) { // max_file_store reached: JetStream's limit, not the disk
		var err error
		big := make([]byte, 60<<10)
		for i := 0; err == nil && i < 100; i++ {
			_, err = js.Publish(ctx, "s.fill", big)
		}
		if err == nil {
			t.Fatal("1 MiB of store took 6 MB")
		}
		checkDiagnosis(t, diagnoseStream(ctx, nc, js, "S", err, sent), condStoreFull, "the job store is full (JetStream: ")
		_ = stream.Purge(ctx)
	})
	t.Run("Refused", func(t *testing.T) { // a limit of the stream's own
		_, err := js.Publish(ctx, "s.big", make([]byte, 65<<10))
		if err == nil {
			t.Fatal("a message over the stream's size limit was stored")
		}
		checkDiagnosis(t, diagnoseStream(ctx, nc, js, "S", err, sent), condRefused, "JetStream refused the write (")
	})
	t.Run("Stalled", func(t *testing.T) { // a write unanswered while the stream answers
		checkDiagnosis(t, diagnoseStream(ctx, nc, js, "S", context.DeadlineExceeded, sent), condStalled,
			"stream S takes no writes while its leader answers: its disk is likely full or read-only")
	})
	t.Run("StalledAfterWritesInFlight", func(t *testing.T) { // those sent with it landed, it did not
		sent := time.Now()
		if _, err := js.Publish(ctx, "s.with", nil); err != nil {
			t.Fatal(err)
		}
		checkDiagnosis(t, diagnoseStream(ctx, nc, js, "S", context.DeadlineExceeded, sent), condStalled,
			"stream S takes no writes while its leader answers")
	})
	t.Run("Slow", func(t *testing.T) { // unanswered while the stream stored writes seconds later
		sent := time.Now().Add(-3 * time.Second)
		if _, err := js.Publish(ctx, "s.later", nil); err != nil {
			t.Fatal(err)
		}
		checkDiagnosis(t, diagnoseStream(ctx, nc, js, "S", context.DeadlineExceeded, sent), condUnanswered,
			"JetStream stored later writes meanwhile: the server is slow, not stalled")
	})
	t.Run("NoResponders", func(t *testing.T) { // no stream took it: JetStream restarting
		checkDiagnosis(t, diagnoseStream(ctx, nc, js, "S", jetstream.ErrNoStreamResponse, sent), condUnanswered,
			"JetStream was restarting, or off")
	})
	t.Run("Disconnected", func(t *testing.T) {
		closed, err := nats.Connect(nc.ConnectedUrl())
		if err != nil {
			t.Fatal(err)
		}
		closed.Close()
		cjs, _ := jetstream.New(closed)
		_, err = cjs.Publish(ctx, "s.x", nil)
		checkDiagnosis(t, diagnoseStream(ctx, closed, cjs, "S", err, sent), condDisconnected, "connection to NATS is down")
	})
}

// TestDiagnosisOfDisks: a full disk (a real one where the test may mount a tmpfs) and a
// read-only one (nats-server's words for it) say "disk", and which.
func TestDiagnosisOfDisks(t *testing.T) {
	t.Parallel()
	const words = "JetStream stream '$G > KV_JOBS' write error: write /s/1.blk: "
	checkDiagnosis(t, mustDiagnose(t, fmt.Errorf("%s%w", words, syscall.EROFS)), condReadOnly,
		"the job store's disk is read-only (", "read-only file system")
	checkDiagnosis(t, mustDiagnose(t, fmt.Errorf("%s%w", words, syscall.ENOSPC)), condDiskFull,
		"the job store's disk is full (", "no space left on device")
	checkDiagnosis(t, mustDiagnose(t, &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}),
		condNoMeta, "no meta leader")

	// The store guard's own report of a disk that filled up under nats-server.
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk).CombinedOutput(); err != nil {
		t.Skipf("a real full disk needs a tmpfs, which is not permitted here (run as root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := exec.Command("umount", disk).Run(); err != nil {
			_ = exec.Command("umount", "-l", disk).Run()
		}
	})
	srv, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(disk), embeddednats.WithStoreGuard(20*time.Millisecond, 64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.before", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// The disk fills up under the server (its own limit, 75% of the free space, is not
	// reached): the stream's next writes fail.
	ballast, err := os.Create(filepath.Join(disk, "ballast"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for n := len(chunk); n >= 1; n /= 16 {
		for {
			if _, err := ballast.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
	_ = ballast.Close()
	testkit.Wait(t, 30*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, _ = js.Publish(pctx, "s.during", make([]byte, 1024))
		if srv.StoreFault() == nil {
			return errors.New("the store guard reports no fault yet")
		}
		return nil
	})
	checkDiagnosis(t, mustDiagnose(t, srv.StoreFault()), condDiskFull, "the job store's disk is full (", "no space left on device")
}

func mustDiagnose(t *testing.T, err error) diagnosis {
	t.Helper()
	d, ok := diagnoseError(err)
	if !ok {
		t.Fatalf("%v: not diagnosed from the error alone", err)
	}
	return d
}
