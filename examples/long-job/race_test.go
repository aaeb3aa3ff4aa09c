//go:build race

package main

// buildFlags build the redislock command as this test binary was built,
// so that the build reuses its compiled packages.
var buildFlags = []string{"-race"}
