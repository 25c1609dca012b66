package samplerd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
)

// shmDir is where Linux keeps POSIX shm objects: shm_open(key) opens shmDir + key.
const shmDir = "/dev/shm"

// shmSerial makes the keys of one process unique, so that a name the server refuses (taken
// already) is reported by the server rather than by a clash of local files.
var shmSerial atomic.Uint64

// HostShmRegion is a POSIX shared-memory object this client created, mapped read-write and
// registered with the server under a name: logits written into it are sampled by reference,
// without sending them. It grows (and is registered again) when a tensor does not fit.
//
// A region holds one tensor at a time: HostShmRegion.Sample calls are serialised, and
// concurrent decode loops should use one region each. Close it when done (Client.Close closes
// the regions still open).
type HostShmRegion struct {
	client *Client
	name   string
	key    string

	mu         sync.Mutex
	data       []byte // the mapping; nil once closed or after a failed Grow
	registered bool   // the server knows the region at len(data) bytes
	closed     bool
}

// NewHostShmRegion creates the shm object "/dev/shm<prefix><name>-<pid>-<n>" (prefix: the
// WithShmPrefix option, default "/samplerd-") of byteSize bytes, maps it and registers it as
// region name (1 to 128 characters of [A-Za-z0-9._-]). Needs the server on the same host, over
// its unix socket. On error nothing is left behind.
func (c *Client) NewHostShmRegion(ctx context.Context, name string, byteSize int) (*HostShmRegion, error) {
	if !validRegionName(name) {
		return nil, invalidArgument("expected a region name of 1 to 128 characters [A-Za-z0-9._-], got %q", name)
	}
	if byteSize < 1 {
		return nil, invalidArgument("expected a region of at least 1 byte, got %d", byteSize)
	}
	prefix := c.opts.shmPrefix
	if !strings.HasPrefix(prefix, "/") || strings.Contains(prefix[1:], "/") {
		return nil, invalidArgument("expected a shm prefix \"/NAME\" with no further '/', got %q", prefix)
	}
	r := &HostShmRegion{
		client: c,
		name:   name,
		key:    fmt.Sprintf("%s%s-%d-%d", prefix, name, os.Getpid(), shmSerial.Add(1)),
	}
	// The region joins the client's before it is made, with r.mu held until it is, so that a
	// Client.Close meanwhile waits for it and then closes it: none is left behind.
	r.mu.Lock()
	defer r.mu.Unlock()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClientClosed
	}
	c.regions[r] = struct{}{}
	c.mu.Unlock()
	fail := func(err error) (*HostShmRegion, error) {
		r.closed = true
		c.mu.Lock()
		delete(c.regions, r)
		c.mu.Unlock()
		return nil, err
	}
	if err := r.mapObject(byteSize, true); err != nil {
		return fail(err)
	}
	if _, err := c.RegisterHostShm(ctx, name, r.key, 0, uint64(len(r.data))); err != nil {
		r.release()
		return fail(err)
	}
	r.registered = true
	return r, nil
}

// Name is the region's name on the server.
func (r *HostShmRegion) Name() string { return r.name }

// Key is the shm object's key (shm_open name, "/dev/shm" + Key is its path).
func (r *HostShmRegion) Key() string { return r.key }

// Size is the region's current byte size.
func (r *HostShmRegion) Size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.data)
}

// Bytes returns the whole mapping, to write logits of any dtype into (little-endian). It stays
// valid until the region grows or closes.
func (r *HostShmRegion) Bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.data
}

// Float32s returns the mapping as float32 values (Size()/4 of them), to write fp32 logits into
// in place; valid until the region grows or closes. Assumes a little-endian machine, as every
// supported one is.
func (r *HostShmRegion) Float32s() []float32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.data) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&r.data[0])), len(r.data)/4)
}

// Tensor returns a Tensor that references [batch, vocab] elements of dtype at byte offset of
// the region, for Client.SampleTensor or Session.SampleTensor.
func (r *HostShmRegion) Tensor(dtype DType, batch, vocab int, offset uint64) Tensor {
	return Tensor{DType: dtype, Batch: batch, Vocab: vocab, Region: r.name, Offset: offset}
}

// WriteFP32 copies logits ([batch, vocab] row-major, batch*vocab values) to the start of the
// region, growing it first when they do not fit, and returns the Tensor that references them.
func (r *HostShmRegion) WriteFP32(ctx context.Context, logits []float32, batch, vocab int) (Tensor, error) {
	if err := checkShape(len(logits), batch, vocab); err != nil {
		return Tensor{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.grow(ctx, 4*len(logits)); err != nil {
		return Tensor{}, err
	}
	putFloat32s(r.data, logits)
	return r.Tensor(FP32, batch, vocab, 0), nil
}

// Sample writes logits into the region (WriteFP32) and samples them by reference, with the
// same options as Client.Sample. The tokens equal those of Client.Sample on the same logits.
// When the server no longer knows the region (it restarted, or the region was unregistered
// behind this object's back), Sample registers it again and retries once.
func (r *HostShmRegion) Sample(ctx context.Context, logits []float32, batch, vocab int, opts ...SampleOption) (*Result, error) {
	if err := checkShape(len(logits), batch, vocab); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.grow(ctx, 4*len(logits)); err != nil {
		return nil, err
	}
	putFloat32s(r.data, logits)
	res, err := r.client.SampleTensor(ctx, r.Tensor(FP32, batch, vocab, 0), opts...)
	var e *Error
	if errors.As(err, &e) && e.Code == codes.NotFound && strings.HasPrefix(e.Message, "logits.region: ") {
		if _, err := r.client.RegisterHostShm(ctx, r.name, r.key, 0, uint64(len(r.data))); err != nil {
			return nil, err
		}
		return r.client.SampleTensor(ctx, r.Tensor(FP32, batch, vocab, 0), opts...)
	}
	return res, err
}

// Grow makes the region at least byteSize bytes long. A larger region is registered again
// under the same name, so it must not be in use by a request meanwhile; its old contents are
// kept. Bytes and Float32s views taken before are stale afterwards.
func (r *HostShmRegion) Grow(ctx context.Context, byteSize int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.grow(ctx, byteSize)
}

// grow is Grow with r.mu held. Sizes double at least, to keep re-registrations rare.
func (r *HostShmRegion) grow(ctx context.Context, byteSize int) error {
	if r.closed {
		return &Error{Code: codes.FailedPrecondition, Message: "expected an open region, got a closed one"}
	}
	if byteSize <= len(r.data) && r.registered {
		return nil
	}
	size := len(r.data)
	if byteSize > size {
		size = 2 * size
		if size < byteSize {
			size = byteSize
		}
	}
	if r.registered {
		if err := r.client.Unregister(ctx, r.name); err != nil {
			return err
		}
		r.registered = false
	}
	if r.data != nil {
		if err := unix.Munmap(r.data); err != nil {
			return localError(codes.Internal, err, fmt.Sprintf("host shm region %q unmapped", r.name), "munmap")
		}
		r.data = nil
	}
	if err := r.mapObject(size, false); err != nil {
		return err
	}
	if _, err := r.client.RegisterHostShm(ctx, r.name, r.key, 0, uint64(size)); err != nil {
		return err
	}
	r.registered = true
	return nil
}

// mapObject opens the shm object (creating it when create, failing if it exists), sets its
// size to size bytes and maps it read-write into r.data. A created object is unlinked again
// on failure. Errors are RESOURCE_EXHAUSTED, wrapping the OS error (the C++ client's code for
// a host shm object it cannot make); the message names the region, never the key.
func (r *HostShmRegion) mapObject(size int, create bool) error {
	path := shmDir + r.key
	flags := unix.O_RDWR | unix.O_CLOEXEC | unix.O_NOFOLLOW
	if create {
		flags |= unix.O_CREAT | unix.O_EXCL
	}
	expected := fmt.Sprintf("a host shm object of %d bytes for region %q", size, r.name)
	fd, err := unix.Open(path, flags, 0o600)
	if err != nil {
		return localError(codes.ResourceExhausted, err, expected, "open")
	}
	defer unix.Close(fd)
	fail := func(op string, err error) error {
		if create {
			_ = unix.Unlink(path)
		}
		return localError(codes.ResourceExhausted, err, expected, op)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail("ftruncate", err)
	}
	data, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	r.data = data
	return nil
}

// Close unregisters the region (if the server still has it), then unmaps and unlinks the shm
// object. The server keeps its own mapping until requests that use the region finish. Closing
// twice is harmless; returns the first error met.
func (r *HostShmRegion) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	r.client.mu.Lock()
	delete(r.client.regions, r)
	r.client.mu.Unlock()
	var first error
	if r.registered {
		first = r.client.Unregister(context.Background(), r.name)
		r.registered = false
	}
	if err := r.release(); err != nil && first == nil {
		first = err
	}
	return first
}

// release unmaps and unlinks the object. Returns the first failure as INTERNAL, wrapping the
// OS error.
func (r *HostShmRegion) release() error {
	var first error
	op := "munmap"
	if r.data != nil {
		first = unix.Munmap(r.data)
		r.data = nil
	}
	if err := unix.Unlink(shmDir + r.key); err != nil && !errors.Is(err, unix.ENOENT) && first == nil {
		first, op = err, "unlink"
	}
	if first != nil {
		return localError(codes.Internal, first, fmt.Sprintf("host shm region %q released", r.name), op)
	}
	return nil
}

// validRegionName reports whether name is 1 to 128 characters of [A-Za-z0-9._-], as the
// server requires; it becomes part of a file name, so it is checked here too.
func validRegionName(name string) bool {
	if len(name) < 1 || len(name) > 128 {
		return false
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}
