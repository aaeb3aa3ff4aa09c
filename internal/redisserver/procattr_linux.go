package redisserver

import "syscall"

// procAttr has the kernel kill a server when the test binary that started
// it dies (a timeout, a panic), which runs no cleanup of its own.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
