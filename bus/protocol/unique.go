package protocol

import "time"

// UniqueWhileActive is SUBMIT_JOB's uniqueWhile that makes a job unique, by its task
// type and payload, while it is active (docs/PROTOCOL.md "Extensions").
const UniqueWhileActive = "active"

// HeaderUniqueUntil is a header of a stored record whose job completed within its
// uniqueness window, the window's end, or of a SCHEDULED one that holds a unique key,
// its due time (Unix milliseconds): so that recovery, which reads finished jobs and
// jobs due beyond the schedule window by their headers, knows to read that record whole.
const HeaderUniqueUntil = "Jobbus-Unique-Until"

// MaxUniqueFor bounds SUBMIT_JOB's uniqueForMillis: a unique window lasts at most 30
// days (and never longer than its job is kept).
const MaxUniqueFor = 30 * 24 * time.Hour
