package samplerd_test

import (
	"errors"
	"math"
	"testing"

	"google.golang.org/grpc/codes"

	samplerd "samplerd.dev/client/go"
)

// The logits processors against the real server: what a bitmask, a logit bias and the
// penalties do to the tokens (the encoding is processors_internal_test.go's).

// allowOnly returns bitmask words [len(rows), ceil(vocab/32)] allowing the tokens of each row.
func allowOnly(vocab int, rows ...[]int32) []int32 {
	w := samplerd.BitmaskWords(vocab)
	words := make([]int32, len(rows)*w)
	for r, allowed := range rows {
		for _, t := range allowed {
			words[r*w+int(t)/32] |= int32(uint32(1) << (uint32(t) % 32))
		}
	}
	return words
}

func TestBitmaskAllowingOneTokenAlwaysGivesThatToken(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 4, 1000
	logits := randomLogits(11, batch, vocab)
	mask := samplerd.TokenBitmask(allowOnly(vocab, []int32{7}, []int32{999}, []int32{32}, []int32{0}))
	for seed := uint64(0); seed < 5; seed++ {
		res, err := client.Sample(ctx, logits, batch, vocab, mask, samplerd.Seed(seed), samplerd.TopK(50))
		if err != nil {
			t.Fatal(err)
		}
		equalTokens(t, "one allowed token", res.Tokens, []int32{7, 999, 32, 0})
	}
}

func TestRowWithNothingAllowedGetsNoAllowedAndNeighboursAreSampled(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 3, 100
	logits := randomLogits(12, batch, vocab)
	res, err := client.Sample(ctx, logits, batch, vocab, samplerd.Temperature(0),
		samplerd.TokenBitmask(allowOnly(vocab, []int32{5}, nil, []int32{6})))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "tokens", res.Tokens, []int32{5, -1, 6})
	want := []samplerd.RowStatus{samplerd.RowOK, samplerd.RowInvalidNoAllowed, samplerd.RowOK}
	for i := range want {
		if res.RowStatus[i] != want[i] {
			t.Errorf("row %d: status %v, want %v", i, res.RowStatus[i], want[i])
		}
	}
}

func TestInfiniteBiasBansAndForcesTokens(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 2, 200
	logits := randomLogits(13, batch, vocab)
	top := argmax(logits, batch, vocab)
	ninf, inf := float32(math.Inf(-1)), float32(math.Inf(1))
	banned, err := client.Sample(ctx, logits, batch, vocab, samplerd.Temperature(0),
		samplerd.LogitBias(map[int32]float32{top[0]: ninf, top[1]: ninf}))
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; r < batch; r++ {
		if second := topIndices(logits[r*vocab:(r+1)*vocab], 2)[1]; banned.Tokens[r] != second {
			t.Errorf("row %d: got %d, want the second best %d", r, banned.Tokens[r], second)
		}
	}
	forced, err := client.Sample(ctx, logits, batch, vocab, samplerd.Seed(1),
		samplerd.LogitBiasRows([]map[int32]float32{{17: inf}, {180: inf}}))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "forced", forced.Tokens, []int32{17, 180})
}

func TestPenaltiesMoveTheArgmax(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	// Repetition 2 on token 0: 2 / 2 = 1 < 1.5 and -1 * 2 = -2 < -1.5.
	logits := []float32{2, 1.5, -5, -1, -1.5, -5}
	res, err := client.Sample(ctx, logits, 2, 3, samplerd.Temperature(0), samplerd.RepetitionPenalty(2),
		samplerd.TokenHistory([][]int32{{0}, {0}}, nil))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "repetition", res.Tokens, []int32{1, 1})
	// Frequency 0.6 on two outputs of token 0: 3 - 1.2 = 1.8 < 2; presence 1.5: 3 - 1.5 < 2.
	logits = []float32{3, 2, 0, 3, 2, 0, 3, 2, 0}
	res, err = client.Sample(ctx, logits, 3, 3, samplerd.Temperature(0),
		samplerd.FrequencyPenalty(0.6, 0, 0), samplerd.PresencePenalty(0, 0, 1.5),
		samplerd.TokenHistory([][]int32{nil, nil, nil}, [][]int32{{0, 0}, {0, 0}, {0}}))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "frequency and presence", res.Tokens, []int32{1, 0, 1})
}

func TestSessionStepsCarryTheProcessors(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	session, err := client.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	const batch, vocab = 2, 128
	res, err := session.Sample(randomLogits(14, batch, vocab), batch, vocab, samplerd.Temperature(0),
		samplerd.TokenBitmaskRows([][]int32{allowOnly(vocab, []int32{3}), allowOnly(vocab, []int32{100})}),
		samplerd.LogitBias(map[int32]float32{3: -1}), samplerd.RepetitionPenalty(1.1),
		samplerd.TokenHistory(nil, [][]int32{{3}, {4}}))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "step", res.Tokens, []int32{3, 100})
}

func TestServerChecksProcessorTokenIds(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 2, 50
	_, err := client.Sample(ctx, randomLogits(15, batch, vocab), batch, vocab,
		samplerd.LogitBias(map[int32]float32{50: 1}))
	var e *samplerd.Error
	if !errors.As(err, &e) || e.Code != codes.InvalidArgument {
		t.Fatalf("got %v, want INVALID_ARGUMENT for token 50 of V = 50", err)
	}
}
