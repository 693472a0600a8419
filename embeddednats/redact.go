package embeddednats

// Redact hides the passwords and tokens in a comma-separated list of NATS URLs, for
// logs and messages.
func Redact(urls string) string { return redact(urls) }
