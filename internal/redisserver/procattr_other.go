//go:build !linux

package redisserver

import "syscall"

// procAttr is nil where the kernel cannot kill a server with its parent.
func procAttr() *syscall.SysProcAttr { return nil }
