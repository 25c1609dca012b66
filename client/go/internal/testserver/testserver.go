// Package testserver runs the real samplerd binary (CPU backend, a unix socket in a fresh
// temporary directory) for the Go client's tests.
package testserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	samplerd "samplerd.dev/client/go"
)

// Server is a running samplerd process.
type Server struct {
	// Target is the address to Dial: "unix://<dir>/s.sock".
	Target string
	dir    string
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
}

// Binary is the samplerd binary to test: $SAMPLERD_BIN, else the default CMake build of this
// checkout, <repo>/build/default/service/samplerd.
func Binary() string {
	if bin := os.Getenv("SAMPLERD_BIN"); bin != "" {
		return bin
	}
	_, file, _, _ := runtime.Caller(0) // <repo>/client/go/internal/testserver/testserver.go
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "build", "default", "service", "samplerd")
}

// Start starts Binary() with --backend=cpu on a fresh unix socket, plus args, and waits (up to
// 30 s) until it reports SERVING. On failure the error includes the server's log.
func Start(args ...string) (*Server, error) {
	bin := Binary()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("no samplerd binary (set SAMPLERD_BIN or build build/default): %w", err)
	}
	dir, err := os.MkdirTemp("", "samplerd-go.")
	if err != nil {
		return nil, err
	}
	s := &Server{Target: "unix://" + filepath.Join(dir, "s.sock"), dir: dir, exited: make(chan error, 1)}
	log, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer log.Close()
	s.cmd = exec.Command(bin, append([]string{"--backend=cpu", "--threads=2", "--listen=" + s.Target}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() { s.exited <- s.cmd.Wait() }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := samplerd.Dial(s.Target)
	if err != nil {
		s.kill()
		return nil, err
	}
	defer client.Close()
	ready := make(chan error, 1)
	go func() { ready <- client.WaitServing(ctx) }()
	select {
	case err = <-ready:
	case err = <-s.exited:
		s.exited <- err // for Stop
		err = fmt.Errorf("samplerd exited during start-up: %v", err)
	}
	if err != nil {
		logText := s.Log()
		s.kill()
		return nil, fmt.Errorf("samplerd did not start: %w\n%s", err, logText)
	}
	return s, nil
}

// Log returns what the server has written to stdout and stderr so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	return string(b)
}

// Stop sends SIGTERM and waits up to 20 s for a clean exit (status 0), killing the process
// otherwise, then removes its directory. Returns an error unless the server exited cleanly.
func (s *Server) Stop() error {
	defer os.RemoveAll(s.dir)
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("samplerd: SIGTERM: %w", err)
	}
	select {
	case err := <-s.exited:
		if err != nil {
			return fmt.Errorf("samplerd did not exit cleanly on SIGTERM: %w\n%s", err, s.Log())
		}
		return nil
	case <-time.After(20 * time.Second):
		s.kill()
		return fmt.Errorf("samplerd did not exit within 20 s of SIGTERM; killed\n%s", s.Log())
	}
}

// kill ends the process, waits for it and removes its directory.
func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
	os.RemoveAll(s.dir)
}

// Run is a package's TestMain body: it starts a server, sets *target to its address, runs the
// tests, stops the server and returns the exit code (non-zero also when the server misbehaved).
//
//	func TestMain(m *testing.M) { os.Exit(testserver.Run(m, &target)) }
func Run(m *testing.M, target *string) int {
	server, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*target = server.Target
	code := m.Run()
	if err := server.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
