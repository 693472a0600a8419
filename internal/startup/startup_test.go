package startup_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jobbus/jobbus/internal/startup"
)

var errNotYet = errors.New("cluster not formed")

func TestWait(t *testing.T) {
	t.Parallel()
	t.Run("RetriesUntilItWorksAndSaysWhatItWaitsFor", func(t *testing.T) {
		var log bytes.Buffer
		tries := 0
		err := startup.Wait(context.Background(), slog.New(slog.NewTextHandler(&log, nil)), "the bucket", func(ctx context.Context) error {
			if _, ok := ctx.Deadline(); !ok {
				t.Error("a try without a deadline of its own")
			}
			if tries++; tries < 3 {
				return errNotYet
			}
			return nil
		})
		if err != nil || tries != 3 {
			t.Fatalf("Wait = %v after %d tries, want nil after 3", err, tries)
		}
		for _, want := range []string{`msg="waiting for the bucket" err="cluster not formed"`, `msg="ready: the bucket"`} {
			if !strings.Contains(log.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, log.String())
			}
		}
	})
	t.Run("PermanentAtOnce", func(t *testing.T) {
		tries := 0
		err := startup.Wait(context.Background(), nil, "x", func(context.Context) error {
			tries++
			return startup.Permanent(errNotYet)
		})
		if !errors.Is(err, errNotYet) || startup.IsPermanent(err) || tries != 1 {
			t.Fatalf("Wait = %v after %d tries, want the unwrapped error after 1", err, tries)
		}
	})
	t.Run("UntilTheContextEnds", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := startup.Wait(ctx, nil, "x", func(context.Context) error { return errNotYet })
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errNotYet) {
			t.Fatalf("Wait = %v, want the deadline and the last error", err)
		}
	})
}
