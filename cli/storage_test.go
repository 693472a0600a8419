package cli_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jobbus/jobbus/bus/protocol"
	"github.com/jobbus/jobbus/client"
)

// Real storage faults: a small tmpfs as the store, filled with a ballast file, or
// mounted read-only. They need mount(8), so root; elsewhere they skip, saying why.

// tmpfs mounts a tmpfs of size (mount's syntax: "8m") for the test and unmounts it at
// the end, after the processes started later are gone.
func tmpfs(t *testing.T, size string, opts ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	o := strings.Join(append([]string{"size=" + size}, opts...), ",")
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", o, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("storage fault tests mount a tmpfs, which is not permitted here (run them as root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s; detaching it", dir, err, out)
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}

// remount remounts dir with mode, "ro" or "rw".
func remount(t *testing.T, dir, mode string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,"+mode, dir).CombinedOutput(); err != nil {
		t.Fatalf("remount %s %s: %v: %s", dir, mode, err, out)
	}
}

// fillDisk writes a ballast file into dir until its disk has no room left, in ever
// smaller pieces, and returns the file's path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ballast")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for size := int64(1 << 20); size >= 1; size /= 16 {
		for {
			if _, err := io.CopyN(f, zeroReader{}, size); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", dir, err)
				}
				break
			}
		}
	}
	return path
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// storeFaultRun is one storage fault's run: the client, the jobs that got
// JOB_SUBMITTED, and what the refusals said.
type storeFaultRun struct {
	t        *testing.T
	cl       *client.Client
	accepted []string
}

func newStoreFaultRun(t *testing.T, url string) *storeFaultRun {
	nc := natsConnect(t, url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	// Longer than a job write's own 5 s, so that a submission caught by the fault
	// hears the coordinator's answer, not its own timeout.
	return &storeFaultRun{t: t, cl: client.New(nc, client.WithTimeout(10*time.Second))}
}

// submit submits a SLEEP of ms and returns its id, or the error.
func (r *storeFaultRun) submit(ms int) (string, error) {
	id, err := r.cl.Submit(context.Background(), "SLEEP", map[string]int{"durationMillis": ms})
	if err == nil {
		r.accepted = append(r.accepted, id)
	}
	return id, err
}

// running submits a job that runs for ms and waits until it runs.
func (r *storeFaultRun) running(ms int) string {
	r.t.Helper()
	id, err := r.submit(ms)
	if err != nil {
		r.t.Fatal(err)
	}
	eventually(r.t, "job "+id+" running", func() bool {
		j, err := r.cl.Status(context.Background(), id)
		return err == nil && j.State == protocol.StateRunning
	})
	return id
}

// refused submits until one is refused with an error that says every one of want,
// and returns it. A submission that finds room after all (a page of the disk not yet
// used up) is accepted: its JOB_SUBMITTED must hold, and allCompleted checks it.
func (r *storeFaultRun) refused(want ...string) string {
	r.t.Helper()
	var last string
	start, tries := time.Now(), 0
	var took time.Duration
	defer func() {
		if r.t.Failed() {
			r.t.Logf("the last of %d submissions was answered in %v: %s", tries, took.Round(time.Millisecond), last)
		}
	}()
	eventually(r.t, fmt.Sprintf("a submission refused with %q", want), func() bool {
		tries++
		at := time.Now()
		_, err := r.submit(1)
		took = time.Since(at)
		if err == nil {
			return false
		}
		last = err.Error()
		for _, w := range want {
			if !strings.Contains(last, w) {
				return false
			}
		}
		return true
	})
	r.t.Logf("refused after %v (%d submissions; the last answered in %v): %s", time.Since(start).Round(time.Millisecond),
		tries, took.Round(time.Millisecond), last)
	return last
}

// acceptedAgain waits until a submission is accepted again.
func (r *storeFaultRun) acceptedAgain() time.Duration {
	r.t.Helper()
	start := time.Now()
	var last error
	eventually(r.t, "a submission accepted again", func() bool {
		_, last = r.submit(1)
		return last == nil
	})
	return time.Since(start)
}

// allCompleted waits until every job that got JOB_SUBMITTED is COMPLETED, as the
// client at url sees it.
func (r *storeFaultRun) allCompleted(url string) {
	r.t.Helper()
	cl := client.New(natsConnect(r.t, url), client.WithTimeout(10*time.Second))
	for _, id := range r.accepted {
		var j protocol.Job
		eventually(r.t, "job "+id+" completed", func() bool {
			var err error
			j, err = cl.Status(context.Background(), id)
			return err == nil && j.State == protocol.StateCompleted
		})
		if j.Result == nil || !strings.HasPrefix(*j.Result, "slept ") {
			r.t.Errorf("job %s: %+v", id, j)
		}
		if id == r.accepted[0] {
			r.t.Logf("the job running when the fault hit: COMPLETED after %d attempt(s)", j.Attempts)
		}
	}
}

// TestServeFullDisk: serve's store on a real disk that fills up (an 8 MiB tmpfs and a
// ballast file, no --nats-max-store). Submissions are refused with an ERROR that says
// the store is full and why (one the fault caught mid-write hears "Outcome unknown"
// with the same cause: its write may have been stored), never a JOB_SUBMITTED that
// does not hold, and never "not stored" for what may be stored; the job that
// was running is not lost; once the ballast is deleted, serve restarts JetStream by
// itself and takes submissions again; every job that got JOB_SUBMITTED completes, and
// is there after a restart of serve on the same store.
func TestServeFullDisk(t *testing.T) {
	t.Parallel()
	disk := tmpfs(t, "8m")
	data := filepath.Join(disk, "data")
	args := []string{"--workers", "1", "--heartbeat-timeout-millis", "1500", "--sweep-interval-millis", "50"}
	p, url := serveProc(t, data, args...)
	r := newStoreFaultRun(t, url)
	r.running(1500)

	ballast := fillDisk(t, disk)
	r.refused("the job store is full", "no space left on device")
	p.logged(`JetStream's store failed`)
	if _, err := r.submit(1); err == nil || !strings.Contains(err.Error(), "job not stored: the job store is full") {
		t.Fatalf("a submission while the disk is full: %v; want refused, nothing stored", err)
	}

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	took := r.acceptedAgain()
	p.logged(`restarted JetStream`)
	t.Logf("accepted again %v after the ballast was deleted; %d jobs got JOB_SUBMITTED", took.Round(time.Millisecond), len(r.accepted))
	r.allCompleted(url)

	// Accepted means durable: the same jobs, COMPLETED, after a restart.
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	_, url = serveProc(t, data, args...)
	r.allCompleted(url)
}

// TestServeWaitsForWritableStore: serve started on a store mounted read-only says so
// and waits, instead of exiting; remounted read-write, it starts by itself and runs
// jobs. (Linux refuses to remount a file system read-only while a process has files
// open on it for writing, as nats-server has its streams' blocks: a store becomes
// read-only under a running server only when the kernel forces it after disk errors,
// which TestServeForcedReadOnly makes.)
func TestServeWaitsForWritableStore(t *testing.T) {
	t.Parallel()
	disk := tmpfs(t, "8m")
	data := filepath.Join(disk, "data")
	remount(t, disk, "ro")
	p := startProc(t, nil, "serve", "--data-dir", data, "--nats-listen", "127.0.0.1:-1",
		"--worker-port", "-1", "--client-port", "-1", "--http-listen", "-", "--workers", "1")
	p.logged(`msg="cannot start on this store; waiting until it takes writes" err=".*read-only file system`)
	remount(t, disk, "rw")
	url := p.logged(`msg="embedded NATS started" url=(\S+)`)[1]
	p.logged(`msg="coordinator serving"`)
	r := newStoreFaultRun(t, url)
	if _, err := r.submit(1); err != nil {
		t.Fatal(err)
	}
	r.allCompleted(url)
}

// TestCoordinatorFullDiskExternalNATS: the same full disk under an external
// nats-server that `jobbus coordinator` uses. jobbus cannot restart that server's
// JetStream, and nats-server writes to a stream whose disk write failed only after a
// restart: so submissions are refused with an ERROR that says the store takes no
// writes and what to do, also after space returns, until the operator restarts
// nats-server; then submissions are taken again by themselves, the job that was
// running completes, and nothing that got JOB_SUBMITTED is lost.
func TestCoordinatorFullDiskExternalNATS(t *testing.T) {
	t.Parallel()
	disk := tmpfs(t, "8m")
	store := filepath.Join(disk, "nats")
	port := freePorts(t, 1)[0]
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	server := natsServer(t, port, store)
	coord := startProc(t, nil, "--nats", url, "coordinator", "--http-listen", "-", "--heartbeat-timeout-millis", "1500", "--sweep-interval-millis", "50")
	coord.logged(`msg="coordinator serving"`)
	startProc(t, nil, "--nats", url, "worker", "--heartbeat-interval-millis", "200")
	r := newStoreFaultRun(t, url)
	eventually(t, "a worker listed", func() bool {
		ws, err := r.cl.Workers(context.Background())
		return err == nil && len(ws) > 0
	})
	r.running(1500)

	ballast := fillDisk(t, disk)
	r.refused("the job store takes no writes", "restart")
	coord.logged(`the job store takes no writes: accepted jobs are kept`)
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	r.refused("the job store takes no writes") // still: nats-server's stream stays failed

	if err := server.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, "nats-server stopped", func() bool { return !alive(server) })
	natsServer(t, port, store)
	took := r.acceptedAgain()
	t.Logf("accepted again %v after nats-server restarted; %d jobs got JOB_SUBMITTED", took.Round(time.Millisecond), len(r.accepted))
	r.allCompleted(url)
}

// alive reports whether cmd's process still runs.
func alive(cmd *exec.Cmd) bool {
	return cmd.Process.Signal(syscall.Signal(0)) == nil
}

// ext4 mounts a fresh ext4 file system of size bytes, on a loop device, for the test,
// with errors=remount-ro: the kernel makes it read-only at the first error, as it does
// a real disk that fails. It returns the mount point and the image, or skips.
func ext4(t *testing.T, size int64) (dir, image string) {
	t.Helper()
	base := t.TempDir()
	image, dir = filepath.Join(base, "disk.img"), filepath.Join(base, "disk")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(image, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", image).CombinedOutput(); err != nil {
		t.Skipf("the forced read-only test needs mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop,errors=remount-ro", image, dir).CombinedOutput(); err != nil {
		t.Skipf("the forced read-only test mounts an ext4 image on a loop device, which is not permitted here (run it as root): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s; detaching it", dir, err, out)
			_ = exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir, image
}

// TestServeForcedReadOnly: the kernel turns serve's store read-only under it (ext4's
// reaction to a disk error, made with its trigger_fs_error knob). Submissions are
// refused with an ERROR that says the store is read-only, never JOB_SUBMITTED. Such a
// file system stays read-only until it is unmounted and checked, which needs serve
// stopped: after serve is killed, the disk repaired and serve started again, every job
// that got JOB_SUBMITTED, the one running when the disk failed included, completes.
func TestServeForcedReadOnly(t *testing.T) {
	t.Parallel()
	disk, image := ext4(t, 32<<20)
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", disk).Output()
	if err != nil {
		t.Skipf("findmnt: %v", err)
	}
	trigger := filepath.Join("/sys/fs/ext4", filepath.Base(strings.TrimSpace(string(out))), "trigger_fs_error")
	if _, err := os.Stat(trigger); err != nil {
		t.Skipf("this kernel's ext4 has no trigger_fs_error: %v", err)
	}
	data := filepath.Join(disk, "data")
	// --sync always: the kernel drops what was written but not yet synced when it
	// aborts the file system's journal, so without it jobs acknowledged in the last
	// moments before the error are gone after the repair (this test saw all of them go).
	args := []string{"--workers", "1", "--heartbeat-timeout-millis", "1500", "--sweep-interval-millis", "50",
		"--retry-base-delay-millis", "50", "--sync", "always"}
	p, url := serveProc(t, data, args...)
	r := newStoreFaultRun(t, url)
	r.running(1500)

	if err := os.WriteFile(trigger, []byte("1"), 0o200); err != nil {
		t.Fatal(err)
	}
	r.refused("the job store is read-only", "read-only file system")
	p.logged(`JetStream's store failed`)

	// A disk that failed: the process is killed (stopping gracefully would wait for
	// the running job's result, which cannot be stored), the disk repaired.
	p.signal(syscall.SIGKILL)
	p.wait()
	for _, cmd := range [][]string{{"umount", disk}, {"e2fsck", "-fy", image}, {"mount", "-o", "loop,errors=remount-ro", image, disk}} {
		out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !(cmd[0] == "e2fsck" && errors.As(err, &exit) && exit.ExitCode() <= 1) { // 1: errors corrected
			t.Fatalf("%s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}
	_, url = serveProc(t, data, args...)
	r.allCompleted(url)
	t.Logf("%d jobs got JOB_SUBMITTED; all completed after the repair", len(r.accepted))
}
