package cli

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jobbus/jobbus/embeddednats"
)

// storeRetry is how often serve tries again to start on a store it cannot write, and
// storeSay how often it says it is still waiting.
const (
	storeRetry = 500 * time.Millisecond
	storeSay   = 30 * time.Second
)

// startEmbedded starts the embedded server. On a store directory it cannot write (a
// read-only file system, a full disk) it waits, saying so every storeSay, and starts
// once the directory takes writes: like a service that waits for its NATS server,
// serve waits for its disk instead of exiting, and recovers by itself when an operator
// remounts or frees it.
func startEmbedded(ctx context.Context, log *slog.Logger, opts []embeddednats.Option) (*embeddednats.Server, error) {
	var said time.Time
	for {
		srv, err := embeddednats.Start(ctx, opts...)
		if err == nil || !(errors.Is(err, embeddednats.ErrStoreReadOnly) || errors.Is(err, embeddednats.ErrStoreFull)) {
			if err == nil && !said.IsZero() {
				log.Info("the store takes writes: starting")
			}
			return srv, err
		}
		if time.Since(said) >= storeSay {
			log.Error("cannot start on this store; waiting until it takes writes", "err", err)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(storeRetry):
		}
	}
}
