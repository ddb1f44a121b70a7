//go:build race

package main

// raceOn: every child process of the pipeline test is a -race build, which
// starts and warms up kgo several times slower, so the test runs one
// repetition per row instead of two.
const raceOn = true
