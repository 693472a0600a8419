package protocol

// UniqueWhileActive is SUBMIT_JOB's uniqueWhile that makes a job unique, by its task
// type and payload, while it is active (docs/PROTOCOL.md "Extensions").
const UniqueWhileActive = "active"

// HeaderUniqueUntil is a header of a stored record whose job completed within its
// uniqueness window, the window's end, or of a SCHEDULED one that holds a unique key,
// its due time (Unix milliseconds): so that recovery, which reads finished jobs and
// jobs due beyond the schedule window by their headers, knows to read that record whole.
const HeaderUniqueUntil = "Jobbus-Unique-Until"
