//go:build !race

package redislock

// raceEnabled: the race detector is on.
const raceEnabled = false
