package memreturn

// WithReturned makes the goroutine tell f of each return.
func WithReturned(c Config, f func(before, after Sample)) Config {
	c.returned = f
	return c
}

// WithRuntime makes the goroutine read its samples from sample and call free instead of
// debug.FreeOSMemory.
func WithRuntime(c Config, sample func() Sample, free func()) Config {
	c.sample, c.free = sample, free
	return c
}
