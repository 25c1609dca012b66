package samplerd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	samplerd "samplerd.dev/client/go"
)

func TestTopPAboveOneIsInvalidArgumentWithTheServersMessage(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	_, err := client.Sample(ctx, randomLogits(8, 2, 10), 2, 10, samplerd.TopP(1.5))
	wantError(t, err, codes.InvalidArgument, "expected params[0].top_p in (0, 1], got 1.5")
	if got := status.Code(err); got != codes.InvalidArgument {
		t.Errorf("status.Code = %v, want InvalidArgument", got)
	}
	wrapped := fmt.Errorf("engine step 3: %w", err)
	var e *samplerd.Error
	if !errors.As(wrapped, &e) || e.Code != codes.InvalidArgument {
		t.Errorf("errors.As through a wrapper: got %v", e)
	}
}

func TestWrongInlineByteCountIsInvalidArgument(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	tensor := samplerd.Tensor{DType: samplerd.FP32, Batch: 2, Vocab: 3, Data: make([]byte, 10)}
	_, err := client.SampleTensor(ctx, tensor)
	wantError(t, err, codes.InvalidArgument,
		"expected 24 bytes of logits.inline_data for shape [2, 3] and 4-byte elements, got 10 bytes")
}

func TestBatchAboveTheServerLimitIsResourceExhausted(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	_, err := client.Sample(ctx, make([]float32, 4097), 4097, 1)
	wantError(t, err, codes.ResourceExhausted, "expected batch size B <= 4096 (server limit), got 4097")
}

func TestWrongShapesAreRefusedBeforeSending(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	_, err := client.Sample(ctx, make([]float32, 10), 2, 3)
	wantError(t, err, codes.InvalidArgument, "expected batch * vocab = 2 * 3 logits, got 10")
	_, err = client.Sample(ctx, nil, 0, 3)
	wantError(t, err, codes.InvalidArgument, "expected batch >= 1 and vocab >= 1, got batch 0 and vocab 3")
	_, err = client.Sample(ctx, make([]float32, 12), 4, 3, samplerd.Temperature(0, 1))
	wantError(t, err, codes.InvalidArgument, "expected temperature with 1 value (all rows) or B = 4 values, got 2")
}

func TestUnknownRegionIsNotFound(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	tensor := samplerd.Tensor{DType: samplerd.FP32, Batch: 1, Vocab: 4, Region: "go-no-such-region"}
	_, err := client.SampleTensor(ctx, tensor)
	const message = `expected a registered region, got "go-no-such-region", which is not (ListRegions lists them)`
	wantError(t, err, codes.NotFound, "logits.region: "+message)
	wantError(t, client.Unregister(ctx, "go-no-such-region"), codes.NotFound, message)
}

func TestUnreachableServerIsUnavailable(t *testing.T) {
	dead, err := samplerd.Dial("unix:///nonexistent-samplerd-dir/s.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = dead.ServerInfo(ctx)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want UNAVAILABLE", err)
	}
}

// WaitServing on a closed client cannot succeed: it says so at once instead of retrying until
// ctx ends (forever with context.Background()).
func TestWaitServingOnAClosedClientReturnsAtOnce(t *testing.T) {
	client, err := samplerd.Dial(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err = client.WaitServing(ctx)
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("WaitServing took %v on a closed client, want an immediate error", waited)
	}
	wantError(t, err, codes.FailedPrecondition, "expected an open client, got a closed one")
}

// Protobuf cannot send a string that is not UTF-8: the client names the field
// (INVALID_ARGUMENT) instead of returning grpc-go's INTERNAL "error while marshaling".
func TestStringsThatAreNotUTF8AreRefusedNamingTheField(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	logits := randomLogits(40, 1, 4)
	_, err := client.Sample(ctx, logits, 1, 4, samplerd.RequestID("req-\xff"))
	wantError(t, err, codes.InvalidArgument, `expected request_id in UTF-8, got "req-\xff"`)
	_, err = client.Sample(ctx, logits, 1, 4, samplerd.LogitBiasRegion("lists-\xfe", 0))
	wantError(t, err, codes.InvalidArgument, `expected logit_bias.region in UTF-8, got "lists-\xfe"`)
	_, err = client.RegisterHostShm(ctx, "shm", "/samplerd-\xff", 0, 8)
	wantError(t, err, codes.InvalidArgument, "expected host_shm.key in UTF-8, got one that is not")
	wantError(t, client.Unregister(ctx, "\xc3"), codes.InvalidArgument, `expected name in UTF-8, got "\xc3"`)
}
