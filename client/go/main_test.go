// Tests of the client against the real samplerd binary (CPU backend), started once for the
// package by TestMain (see internal/testserver; SAMPLERD_BIN picks the binary).
package samplerd_test

import (
	"context"
	"errors"
	"math"
	"math/rand"
	"os"
	"sort"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	samplerd "samplerd.dev/client/go"
	"samplerd.dev/client/go/internal/testserver"
)

// target is the running server's address.
var target string

func TestMain(m *testing.M) { os.Exit(testserver.Run(m, &target)) }

// dial returns a client of the test server, closed when the test ends.
func dial(t *testing.T, opts ...samplerd.Option) *samplerd.Client {
	t.Helper()
	client, err := samplerd.Dial(target, opts...)
	if err != nil {
		t.Fatalf("Dial(%q): %v", target, err)
	}
	t.Cleanup(func() {
		if err := client.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return client
}

// testContext is a context that ends with the test (or after a minute).
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// randomLogits returns [batch, vocab] standard normal logits from a fixed seed.
func randomLogits(seed int64, batch, vocab int) []float32 {
	rng := rand.New(rand.NewSource(seed))
	out := make([]float32, batch*vocab)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}

// argmax returns the index of each row's largest value, the lowest index among ties.
func argmax(logits []float32, batch, vocab int) []int32 {
	out := make([]int32, batch)
	for r := 0; r < batch; r++ {
		row := logits[r*vocab : (r+1)*vocab]
		best := 0
		for j, v := range row {
			if v > row[best] {
				best = j
			}
		}
		out[r] = int32(best)
	}
	return out
}

// logSoftmax returns log_softmax of one row, in float64.
func logSoftmax(row []float32) []float64 {
	maxv := math.Inf(-1)
	for _, v := range row {
		maxv = math.Max(maxv, float64(v))
	}
	sum := 0.0
	for _, v := range row {
		sum += math.Exp(float64(v) - maxv)
	}
	out := make([]float64, len(row))
	for j, v := range row {
		out[j] = float64(v) - maxv - math.Log(sum)
	}
	return out
}

// topIndices returns the n indices of row's largest values, largest first (lowest index first
// among ties).
func topIndices(row []float32, n int) []int32 {
	idx := make([]int32, len(row))
	for j := range idx {
		idx[j] = int32(j)
	}
	sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
	return idx[:n]
}

// equalTokens fails the test when got != want.
func equalTokens(t *testing.T, what string, got, want []int32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d tokens %v, want %d %v", what, len(got), got, len(want), want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: got tokens %v, want %v", what, got, want)
		}
	}
}

// wantError fails the test unless err is an *samplerd.Error with code and message.
func wantError(t *testing.T, err error, code codes.Code, message string) {
	t.Helper()
	var e *samplerd.Error
	if !errors.As(err, &e) {
		t.Fatalf("got error %v (%T), want a *samplerd.Error %v %q", err, err, code, message)
	}
	if e.Code != code || e.Message != message {
		t.Fatalf("got %v %q, want %v %q", e.Code, e.Message, code, message)
	}
}
