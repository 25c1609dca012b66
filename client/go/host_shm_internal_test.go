package samplerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// Regression: a host shm object that could not be made came back as a plain fmt error, not an
// *Error, so callers that used errors.As for every failure (as the package says) missed it.
// The object's key is predictable here: an object left by a crashed process of the same pid
// takes it.
func TestHostShmObjectThatExistsIsResourceExhaustedWrappingErrExist(t *testing.T) {
	client, err := Dial("unix:///nonexistent-samplerd-dir/s.sock") // never reached
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	stale := fmt.Sprintf("%s%s-%d-%d", shmDir+DefaultShmPrefix, "go-stale", os.Getpid(), shmSerial.Load()+1)
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(stale)

	_, err = client.NewHostShmRegion(context.Background(), "go-stale", 4096)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v (%T), want a *samplerd.Error", err, err)
	}
	want := `expected a host shm object of 4096 bytes for region "go-stale", got open: file exists`
	if e.Code != codes.ResourceExhausted || e.Message != want {
		t.Errorf("got %v %q, want RESOURCE_EXHAUSTED %q", e.Code, e.Message, want)
	}
	if !errors.Is(err, fs.ErrExist) || !errors.Is(err, unix.EEXIST) {
		t.Errorf("errors.Is(err, fs.ErrExist / EEXIST) = false for %v", err)
	}
	if info, err := os.Stat(stale); err != nil || info.Size() != 0 {
		t.Errorf("the existing object was touched: %v, %v", info, err) // O_EXCL: never opened
	}
}

// Releasing a region whose unmap fails is INTERNAL and wraps the errno; the object is still
// unlinked.
func TestHostShmReleaseFailureIsInternalWrappingTheErrno(t *testing.T) {
	r := &HostShmRegion{name: "go-release", key: fmt.Sprintf("/samplerd-go-release-%d", os.Getpid())}
	if err := r.mapObject(4096, true); err != nil {
		t.Fatal(err)
	}
	mapping := r.data
	defer unix.Munmap(mapping)
	r.data = make([]byte, 4096) // not a mapping: munmap refuses it (EINVAL)

	err := r.release()
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.Internal {
		t.Fatalf("got %v (%T), want a *samplerd.Error INTERNAL", err, err)
	}
	want := `expected host shm region "go-release" released, got munmap: invalid argument`
	if e.Message != want {
		t.Errorf("message %q, want %q", e.Message, want)
	}
	var errno unix.Errno
	if !errors.As(err, &errno) || errno != unix.EINVAL {
		t.Errorf("errors.As(err, &errno) gave %v, want EINVAL", errno)
	}
	if objects, _ := filepath.Glob(shmDir + r.key); len(objects) != 0 {
		t.Errorf("object left behind: %v", objects)
	}
}
