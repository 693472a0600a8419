package embeddednats

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// slogAdapter implements server.Logger. It also remembers the first fatal
// message: nats-server reports startup failures (JetStream, listeners) only
// through Fatalf, and Start turns that into an error. It never exits.
type slogAdapter struct {
	log *slog.Logger

	mu    sync.Mutex
	fatal string
}

func newSlogAdapter(l *slog.Logger) *slogAdapter {
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	return &slogAdapter{log: l.With("component", "nats-server")}
}

func (a *slogAdapter) debugEnabled() bool {
	return a.log.Enabled(context.Background(), slog.LevelDebug)
}

func (a *slogAdapter) emit(level slog.Level, format string, v []any) {
	if !a.log.Enabled(context.Background(), level) {
		return
	}
	a.log.Log(context.Background(), level, fmt.Sprintf(format, v...))
}

func (a *slogAdapter) Noticef(format string, v ...any) { a.emit(slog.LevelDebug, format, v) }
func (a *slogAdapter) Debugf(format string, v ...any)  { a.emit(slog.LevelDebug, format, v) }
func (a *slogAdapter) Tracef(format string, v ...any)  { a.emit(slog.LevelDebug, format, v) }
func (a *slogAdapter) Warnf(format string, v ...any)   { a.emit(slog.LevelWarn, format, v) }
func (a *slogAdapter) Errorf(format string, v ...any)  { a.emit(slog.LevelWarn, format, v) }

func (a *slogAdapter) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	a.mu.Lock()
	if a.fatal == "" {
		a.fatal = msg
	}
	a.mu.Unlock()
	a.log.Error(msg)
}

// fatalMsg returns the first fatal message, or "".
func (a *slogAdapter) fatalMsg() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fatal
}
