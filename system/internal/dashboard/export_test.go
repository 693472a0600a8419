package dashboard

import "context"

// WithWatchOpened has the job watch call f once it has opened a watch of the bucket,
// before it makes that watch the one the pages read; ctx is that watch's.
func WithWatchOpened(f func(ctx context.Context)) func(*Config) {
	return func(c *Config) { c.watchOpened = f }
}
