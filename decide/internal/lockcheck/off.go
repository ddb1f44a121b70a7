//go:build !lockcheck

// Package lockcheck checks, in a build with the lockcheck tag, that the
// decision core never holds two of its locks at once (docs/architecture.md,
// "Locks"): each of the core's lock sites tells it what it takes and when
// it lets go. In any other build its functions do nothing and cost
// nothing.
//
// The check is per goroutine (each step runs on its caller's goroutine):
// go test -tags lockcheck ./decide/... ./sim/... runs decide's tests and
// the simulation with it.
package lockcheck

// On reports whether this build checks.
const On = false

// Take records that the core takes lock what.
func Take(what string) {}

// Drop records that the core let go of the lock it took last.
func Drop() {}
