package samplerd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	samplerd "samplerd.dev/client/go"
	"samplerd.dev/client/go/internal/testserver"
)

// regionSize returns the byte size the server lists for region name, or -1 when it lists none.
func regionSize(t *testing.T, client *samplerd.Client, name string) int64 {
	t.Helper()
	regions, err := client.ListRegions(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regions {
		if r.Name == name {
			return int64(r.ByteSize)
		}
	}
	return -1
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestHostShmRegionGivesTheTokensOfInlineLogits(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 6, 400
	// Too small on purpose: the first Sample grows it (and registers it again).
	region, err := client.NewHostShmRegion(ctx, "go-shm", 64)
	if err != nil {
		t.Fatal(err)
	}
	path := "/dev/shm" + region.Key()
	if !exists(path) || regionSize(t, client, "go-shm") != 64 {
		t.Fatalf("after NewHostShmRegion: %s exists %v, listed size %d; want a 64-byte region",
			path, exists(path), regionSize(t, client, "go-shm"))
	}
	for step := uint64(0); step < 3; step++ {
		logits := randomLogits(int64(40+step), batch, vocab)
		opts := []samplerd.SampleOption{samplerd.TopP(0.9), samplerd.Seed(99), samplerd.Position(step)}
		inline, err := client.Sample(ctx, logits, batch, vocab, opts...)
		if err != nil {
			t.Fatal(err)
		}
		shm, err := region.Sample(ctx, logits, batch, vocab, opts...)
		if err != nil {
			t.Fatal(err)
		}
		equalTokens(t, fmt.Sprintf("step %d", step), shm.Tokens, inline.Tokens)
	}
	if region.Size() < 4*batch*vocab || regionSize(t, client, "go-shm") != int64(region.Size()) {
		t.Errorf("after growing: Size %d, listed %d; want >= %d and equal", region.Size(),
			regionSize(t, client, "go-shm"), 4*batch*vocab)
	}

	// Written in place, sampled at an offset: rows 2.. of the region.
	logits := randomLogits(43, batch, vocab)
	copy(region.Float32s(), logits)
	part, err := client.SampleTensor(ctx, region.Tensor(samplerd.FP32, batch-2, vocab, 2*4*vocab), samplerd.Temperature(0))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "offset", part.Tokens, argmax(logits, batch, vocab)[2:])

	// A session step by reference.
	s := openSession(t, client)
	tensor, err := region.WriteFP32(ctx, logits[:vocab], 1, vocab)
	if err != nil {
		t.Fatal(err)
	}
	step, err := s.SampleTensor(tensor, samplerd.Temperature(0))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "session", step.Tokens, argmax(logits, 1, vocab))

	if err := region.Close(); err != nil {
		t.Fatal(err)
	}
	if exists(path) || regionSize(t, client, "go-shm") != -1 {
		t.Errorf("after Close: %s exists %v, listed size %d; want neither", path, exists(path), regionSize(t, client, "go-shm"))
	}
	_, err = client.SampleTensor(ctx, region.Tensor(samplerd.FP32, 1, vocab, 0))
	wantError(t, err, codes.NotFound,
		`logits.region: expected a registered region, got "go-shm", which is not (ListRegions lists them)`)
	_, err = region.Sample(ctx, logits, batch, vocab)
	wantError(t, err, codes.FailedPrecondition, "expected an open region, got a closed one")
	if err := region.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestHostShmRegionNameTakenIsAlreadyExists(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	first, err := client.NewHostShmRegion(ctx, "go-dup", 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, err = client.NewHostShmRegion(ctx, "go-dup", 1024)
	wantError(t, err, codes.AlreadyExists,
		`expected a new region name, got "go-dup", which is registered already`)
	objects, _ := filepath.Glob(fmt.Sprintf("/dev/shm/samplerd-go-dup-%d-*", os.Getpid()))
	if len(objects) != 1 {
		t.Errorf("shm objects %v, want only the first region's", objects)
	}
}

// A region that cannot be mapped is the client's own failure: an *samplerd.Error
// (RESOURCE_EXHAUSTED, as the C++ client reports a host shm object it cannot make) that wraps
// the OS error, and nothing is left in /dev/shm or registered.
func TestHostShmRegionTooLargeToMapIsResourceExhaustedWrappingTheErrno(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const size = 1 << 50 // 1 PiB: more than a process's address space
	_, err := client.NewHostShmRegion(ctx, "go-huge", size)
	var e *samplerd.Error
	if !errors.As(err, &e) || e.Code != codes.ResourceExhausted {
		t.Fatalf("got %v (%T), want a *samplerd.Error RESOURCE_EXHAUSTED", err, err)
	}
	prefix := fmt.Sprintf(`expected a host shm object of %d bytes for region "go-huge", got `, size)
	if !strings.HasPrefix(e.Message, prefix) {
		t.Errorf("message %q, want it to start with %q", e.Message, prefix)
	}
	// tmpfs takes the size (sparse) and mmap refuses it; a smaller file-size limit would refuse
	// the ftruncate instead.
	var errno syscall.Errno
	if !errors.As(err, &errno) || !(errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.EFBIG)) {
		t.Errorf("errors.As(err, &errno) gave %v (%v), want ENOMEM or EFBIG", errno, err)
	}
	objects, _ := filepath.Glob(fmt.Sprintf("/dev/shm/samplerd-go-huge-%d-*", os.Getpid()))
	if len(objects) != 0 || regionSize(t, client, "go-huge") != -1 {
		t.Errorf("left behind: shm objects %v, listed size %d", objects, regionSize(t, client, "go-huge"))
	}
}

func TestHostShmRegionBadNameIsRefusedBeforeCreatingAnything(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	_, err := client.NewHostShmRegion(ctx, "../etc", 1024)
	wantError(t, err, codes.InvalidArgument,
		`expected a region name of 1 to 128 characters [A-Za-z0-9._-], got "../etc"`)
}

func TestClientCloseReleasesItsRegions(t *testing.T) {
	observer := dial(t)
	client, err := samplerd.Dial(target)
	if err != nil {
		t.Fatal(err)
	}
	region, err := client.NewHostShmRegion(context.Background(), "go-close", 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if exists("/dev/shm"+region.Key()) || regionSize(t, observer, "go-close") != -1 {
		t.Errorf("after Client.Close: object exists %v, listed size %d; want neither",
			exists("/dev/shm"+region.Key()), regionSize(t, observer, "go-close"))
	}
	// As Session.Close and HostShmRegion.Close: a second Close (say, a deferred one after an
	// explicit one) is harmless.
	if err := client.Close(); err != nil {
		t.Errorf("second Client.Close: %v, want nil", err)
	}
}

// A Client.Close that runs while NewHostShmRegion registers its region still releases it: the
// region is neither left in /dev/shm nor registered with the server. (The interceptor starts
// the Close once the server has answered the registration, before NewHostShmRegion returns.)
func TestClientCloseDuringNewHostShmRegionLeavesNothingBehind(t *testing.T) {
	observer, ctx := dial(t), testContext(t)
	var client *samplerd.Client
	closed := make(chan error, 1)
	closeAfterRegister := func(ctx context.Context, method string, req, reply interface{},
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/RegisterRegion") {
			go func() { closed <- client.Close() }()
			time.Sleep(50 * time.Millisecond) // the Close runs while the region is being made
		}
		return err
	}
	client, err := samplerd.Dial(target,
		samplerd.WithDialOptions(grpc.WithUnaryInterceptor(closeAfterRegister)))
	if err != nil {
		t.Fatal(err)
	}
	region, err := client.NewHostShmRegion(ctx, "go-close-race", 4096)
	if err := <-closed; err != nil {
		t.Errorf("Client.Close: %v", err)
	}
	objects, _ := filepath.Glob(fmt.Sprintf("/dev/shm/samplerd-go-close-race-%d-*", os.Getpid()))
	if len(objects) != 0 || regionSize(t, observer, "go-close-race") != -1 {
		t.Errorf("after Client.Close: shm objects %v, listed size %d; want none",
			objects, regionSize(t, observer, "go-close-race"))
	}
	for _, o := range objects {
		os.Remove(o)
	}
	if err == nil {
		_, err = region.Sample(ctx, []float32{1}, 1, 1)
		wantError(t, err, codes.FailedPrecondition, "expected an open region, got a closed one")
	}
	_, err = client.NewHostShmRegion(ctx, "go-after-close", 4096)
	wantError(t, err, codes.FailedPrecondition, "expected an open client, got a closed one")
}

// A server restarted under a live client knows none of the old regions: HostShmRegion.Sample
// registers its region again instead of failing with NOT_FOUND from then on.
func TestHostShmRegionSamplesAgainAfterTheServerRestarts(t *testing.T) {
	ctx := testContext(t)
	sock := filepath.Join(t.TempDir(), "s.sock")
	start := func() *exec.Cmd {
		cmd := exec.Command(testserver.Binary(), "--backend=cpu", "--threads=2", "--listen=unix://"+sock)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	server := start()
	defer func() { server.Process.Kill(); server.Wait() }()
	client, err := samplerd.Dial("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if err := client.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	region, err := client.NewHostShmRegion(ctx, "go-restart", 4096)
	if err != nil {
		t.Fatal(err)
	}
	logits := randomLogits(50, 2, 64)
	if _, err := region.Sample(ctx, logits, 2, 64, samplerd.Temperature(0)); err != nil {
		t.Fatal(err)
	}

	server.Process.Kill()
	server.Wait()
	server = start()
	if err := client.WaitServing(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := region.Sample(ctx, logits, 2, 64, samplerd.Temperature(0))
	if err != nil {
		t.Fatalf("HostShmRegion.Sample after the restart: %v", err)
	}
	equalTokens(t, "after the restart", res.Tokens, argmax(logits, 2, 64))
	if err := region.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
