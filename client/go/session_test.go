package samplerd_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	samplerd "samplerd.dev/client/go"
)

// openSession opens a session of client, closed (and checked) when the test ends.
func openSession(t *testing.T, client *samplerd.Client) *samplerd.Session {
	t.Helper()
	s, err := client.OpenSession(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Session.Close: %v", err)
		}
	})
	return s
}

func TestSessionAnswersStepsInOrder(t *testing.T) {
	s := openSession(t, dial(t))
	const batch, vocab = 4, 128
	for step := 0; step < 5; step++ {
		logits := randomLogits(int64(10+step), batch, vocab)
		id := fmt.Sprintf("step-%d", step)
		res, err := s.Sample(logits, batch, vocab, samplerd.Temperature(0), samplerd.RequestID(id))
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if res.RequestID != id {
			t.Errorf("step %d: RequestID %q, want %q", step, res.RequestID, id)
		}
		equalTokens(t, id, res.Tokens, argmax(logits, batch, vocab))
	}
}

func TestSessionGivesTheTokensOfUnaryCalls(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	s := openSession(t, client)
	const batch, vocab = 6, 400
	seeds := []uint64{7, 8, 9, 10, 11, 12}
	for step := uint64(0); step < 4; step++ {
		logits := randomLogits(int64(20+step), batch, vocab)
		opts := []samplerd.SampleOption{samplerd.TopK(40), samplerd.TopP(0.9), samplerd.Seed(seeds...), samplerd.Position(step)}
		unary, err := client.Sample(ctx, logits, batch, vocab, opts...)
		if err != nil {
			t.Fatal(err)
		}
		streamed, err := s.Sample(logits, batch, vocab, opts...)
		if err != nil {
			t.Fatal(err)
		}
		equalTokens(t, fmt.Sprintf("step %d", step), streamed.Tokens, unary.Tokens)
	}
}

func TestSessionRejectedStepKeepsTheSessionOpen(t *testing.T) {
	s := openSession(t, dial(t))
	logits := randomLogits(30, 2, 16)
	_, err := s.Sample(logits, 2, 16, samplerd.TopK(-5))
	wantError(t, err, codes.InvalidArgument, "expected params[0].top_k >= -1 (0 or -1 disables), got -5")
	res, err := s.Sample(logits, 2, 16, samplerd.Temperature(0), samplerd.RequestID("after"))
	if err != nil {
		t.Fatalf("step after a rejected one: %v", err)
	}
	equalTokens(t, "after", res.Tokens, argmax(logits, 2, 16))
}

// A step larger than the client's message limit is refused before it is sent, and the session
// stays open: grpc-go would otherwise fail the whole stream for it, and every later step.
func TestSessionStepOverTheMessageLimitKeepsTheSessionOpen(t *testing.T) {
	s := openSession(t, dial(t, samplerd.WithMaxMessageBytes(64<<10)))
	big := randomLogits(31, 1, 32<<10) // 128 KiB of logits
	_, err := s.Sample(big, 1, 32<<10)
	var e *samplerd.Error
	if !errors.As(err, &e) || e.Code != codes.ResourceExhausted ||
		!strings.HasPrefix(e.Message, "expected a step message of at most 65536 bytes (WithMaxMessageBytes), got 1310") {
		t.Fatalf("got %v, want RESOURCE_EXHAUSTED for a step message over 65536 bytes", err)
	}
	logits := randomLogits(32, 2, 16)
	res, err := s.Sample(logits, 2, 16, samplerd.Temperature(0))
	if err != nil {
		t.Fatalf("step after the refused one: %v", err)
	}
	equalTokens(t, "after", res.Tokens, argmax(logits, 2, 16))
}

func TestSessionSplitsLargeStepsIntoChunks(t *testing.T) {
	var sent int
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		return &countingStream{ClientStream: cs, sent: &sent}, err
	}
	client := dial(t, samplerd.WithStreamChunkBytes(1000),
		samplerd.WithDialOptions(grpc.WithStreamInterceptor(count)))
	s := openSession(t, client)
	const batch, vocab = 4, 700 // 11,200 bytes: 12 messages of at most 1,000
	logits := randomLogits(31, batch, vocab)
	chunked, err := s.Sample(logits, batch, vocab, samplerd.Seed(5), samplerd.TopP(0.95))
	if err != nil {
		t.Fatal(err)
	}
	if sent != 12 {
		t.Errorf("sent %d stream messages, want 12", sent)
	}
	unary, err := client.Sample(testContext(t), logits, batch, vocab, samplerd.Seed(5), samplerd.TopP(0.95))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "chunked", chunked.Tokens, unary.Tokens)
}

// Regression test: a chunked step lost its logits processors and packed seeds and positions
// (its first message was rebuilt field by field), so the server sampled without them.
func TestSessionChunkedStepKeepsTheProcessorsSeedsAndPositions(t *testing.T) {
	client := dial(t, samplerd.WithStreamChunkBytes(1000))
	s := openSession(t, client)
	const batch, vocab = 2, 700 // 5,600 bytes: 6 messages
	logits := randomLogits(34, batch, vocab)
	banned := argmax(logits, batch, vocab)[1]
	words := samplerd.BitmaskWords(vocab)
	mask := make([]int32, batch*words)
	mask[0] = 1 << 7 // row 0: token 7 only
	for i := words; i < 2*words; i++ {
		mask[i] = -1 // row 1: every token
	}
	opts := []samplerd.SampleOption{samplerd.TopK(50), samplerd.TokenBitmask(mask),
		samplerd.LogitBiasRows([]map[int32]float32{nil, {banned: float32(math.Inf(-1))}}),
		samplerd.RepetitionPenalty(1.5), samplerd.TokenHistory(nil, [][]int32{{1, 2}, {3}}),
		samplerd.Seed(11, 22), samplerd.Position(5, 6),
		samplerd.Logprobs(2, samplerd.LogprobsProcessed)}
	chunked, err := s.Sample(logits, batch, vocab, opts...)
	if err != nil {
		t.Fatal(err)
	}
	unary, err := client.Sample(testContext(t), logits, batch, vocab, opts...)
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "chunked", chunked.Tokens, unary.Tokens)
	if chunked.Tokens[0] != 7 || chunked.Tokens[1] == banned {
		t.Errorf("tokens %v: want 7 (the bitmask's only token) and not %d (banned)",
			chunked.Tokens, banned)
	}
	if chunked.Seeds[0] != 11 || chunked.Seeds[1] != 22 {
		t.Errorf("seeds %v, want [11 22]", chunked.Seeds)
	}
	for i := range unary.Logprobs {
		if !proto.Equal(chunked.Logprobs[i], unary.Logprobs[i]) {
			t.Errorf("row %d: chunked logprobs %v, unary %v", i, chunked.Logprobs[i], unary.Logprobs[i])
		}
	}
}

// countingStream counts the messages sent on a client stream.
type countingStream struct {
	grpc.ClientStream
	sent *int
}

func (c *countingStream) SendMsg(m interface{}) error {
	*c.sent++
	return c.ClientStream.SendMsg(m)
}

func TestSessionAfterCloseFails(t *testing.T) {
	client := dial(t)
	s, err := client.OpenSession(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(randomLogits(32, 1, 8), 1, 8); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err = s.Sample(randomLogits(32, 1, 8), 1, 8)
	wantError(t, err, codes.FailedPrecondition, "expected an open session, got a closed one")
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestSessionEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := dial(t).OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(randomLogits(33, 1, 8), 1, 8); err != nil {
		t.Fatal(err)
	}
	cancel()
	_, err = s.Sample(randomLogits(33, 1, 8), 1, 8)
	if status.Code(err) != codes.Canceled {
		t.Fatalf("step after cancel: got %v, want CANCELED", err)
	}
	if err := s.Close(); status.Code(err) != codes.Canceled {
		t.Errorf("Close after cancel: got %v, want the CANCELED error", err)
	}
}

func TestSessionStepsFromManyGoroutinesGetTheirOwnAnswers(t *testing.T) {
	s := openSession(t, dial(t))
	const workers, steps, batch, vocab = 8, 5, 2, 64
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func(w int) {
			for step := 0; step < steps; step++ {
				logits := randomLogits(int64(100+w*steps+step), batch, vocab)
				id := fmt.Sprintf("w%d-s%d", w, step)
				res, err := s.Sample(logits, batch, vocab, samplerd.Temperature(0), samplerd.RequestID(id))
				if err != nil {
					errs <- err
					return
				}
				if want := argmax(logits, batch, vocab); res.RequestID != id || !equal(res.Tokens, want) {
					errs <- fmt.Errorf("%s: got %q %v, want %v", id, res.RequestID, res.Tokens, want)
					return
				}
			}
			errs <- nil
		}(w)
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
