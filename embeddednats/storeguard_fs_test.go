package embeddednats_test

import (
	"context"
	"errors"
	"io"
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

// mountTmpfs mounts a tmpfs of size for the test, or skips it where mounting is not
// permitted (the tests need root).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("the store guard's tests mount a tmpfs, which is not permitted here (run them as root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s; detaching it", dir, err, out)
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}

// TestStoreGuardRestartsJetStream: a stream whose disk filled up takes no write again
// until JetStream restarts; the guard reports the fault, and once the disk has room
// restarts JetStream in-process: the stream takes writes again and kept what it had.
func TestStoreGuardRestartsJetStream(t *testing.T) {
	t.Parallel()
	disk := mountTmpfs(t, "4m")
	srv := start(t, disk, embeddednats.WithStoreGuard(20*time.Millisecond, 64<<10))
	nc := connect(t, func() (*nats.Conn, error) { return srv.Connect() })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "GUARD", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "before", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := srv.StoreFault(); err != nil {
		t.Fatalf("a fault before the disk filled: %v", err)
	}

	ballast := filepath.Join(disk, "ballast")
	f, err := os.Create(ballast)
	if err != nil {
		t.Fatal(err)
	}
	for size := int64(1 << 20); size >= 1; size /= 16 {
		for {
			if _, err := io.CopyN(f, zeros{}, size); err != nil {
				break
			}
		}
	}
	_ = f.Close()
	// Writes find the disk full (some may still fit in a page the block already has).
	testkit.Eventually(t, 10*time.Second, "a put refused", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err := kv.Put(pctx, "during", make([]byte, 1024))
		return err != nil
	})
	testkit.Eventually(t, 10*time.Second, "the guard reports a full disk", func() bool {
		err := srv.StoreFault()
		return errors.Is(err, embeddednats.ErrStoreFull) && errors.Is(err, syscall.ENOSPC) &&
			strings.Contains(err.Error(), "no space left on device")
	})

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the fault cleared", func() bool { return srv.StoreFault() == nil })
	testkit.Eventually(t, 10*time.Second, "a put stored again", func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := kv.Put(pctx, "after", []byte("v"))
		return err == nil
	})
	e, err := kv.Get(ctx, "before")
	if err != nil || string(e.Value()) != "kept" {
		t.Fatalf("the value written before the fault: %v %v", e, err)
	}
}

// TestStartOnReadOnlyStore: a store directory on a read-only file system is refused
// with ErrStoreReadOnly and a message that says how to fix it.
func TestStartOnReadOnlyStore(t *testing.T) {
	t.Parallel()
	disk := mountTmpfs(t, "1m")
	if out, err := exec.Command("mount", "-o", "remount,ro", disk).CombinedOutput(); err != nil {
		t.Fatalf("remount ro: %v: %s", err, out)
	}
	_, err := embeddednats.Start(context.Background(), embeddednats.WithListen("127.0.0.1:-1"),
		embeddednats.WithStoreDir(filepath.Join(disk, "data")))
	if !errors.Is(err, embeddednats.ErrStoreReadOnly) || !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), "remount,rw") {
		t.Fatalf("Start on a read-only store: %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
