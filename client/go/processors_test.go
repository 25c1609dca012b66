package samplerd_test

import (
	"errors"
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

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

func TestListsInAHostShmRegionGiveTheInlineTokensAndLogprobs(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 3, 500
	logits := randomLogits(16, batch, vocab)
	// Row 1's history holds its two largest logits, the first in the output, the second in the
	// prompt only, so that the penalties and the prompt flags change its distribution.
	top := topIndices(logits[vocab:2*vocab], 2)
	bias := []map[int32]float32{{7: 30, 8: float32(math.Inf(-1))}, nil, {499: 2.5}}
	prompt, output := [][]int32{{1, 2}, {top[1]}, nil}, [][]int32{{2, 2}, {top[0], top[0]}, {9}}
	common := func(more ...samplerd.SampleOption) []samplerd.SampleOption {
		return append([]samplerd.SampleOption{samplerd.Seed(1, 2, 3), samplerd.TopP(0.9),
			samplerd.Logprobs(3, samplerd.LogprobsProcessed), samplerd.RepetitionPenalty(1.4),
			samplerd.FrequencyPenalty(0.3)}, more...)
	}
	inline := common(samplerd.LogitBiasRows(bias), samplerd.TokenHistory(prompt, output))
	want, err := client.Sample(ctx, logits, batch, vocab, inline...)
	if err != nil {
		t.Fatal(err)
	}

	region, err := client.NewHostShmRegion(ctx, "go-lists", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer region.Close()
	history, err := samplerd.PackTokenHistory(prompt, output)
	if err != nil {
		t.Fatal(err)
	}
	copy(region.Bytes(), samplerd.PackLogitBias(bias))
	copy(region.Bytes()[1024:], history)
	fromRegion := common(samplerd.LogitBiasRegion("go-lists", 0), samplerd.TokenHistoryRegion("go-lists", 1024))
	sameAsInline := func(what string, got *samplerd.Result) {
		t.Helper()
		equalTokens(t, what, got.Tokens, want.Tokens)
		for i := range want.Logprobs {
			if !proto.Equal(got.Logprobs[i], want.Logprobs[i]) {
				t.Errorf("%s, row %d: logprobs %v, want the inline lists' %v", what, i, got.Logprobs[i], want.Logprobs[i])
			}
		}
	}
	got, err := client.Sample(ctx, logits, batch, vocab, fromRegion...)
	if err != nil {
		t.Fatal(err)
	}
	sameAsInline("unary", got)
	step, err := openSession(t, client).Sample(logits, batch, vocab, fromRegion...)
	if err != nil {
		t.Fatal(err)
	}
	sameAsInline("session step", step)
	// The lists matter: without them row 0 (bias) and row 1 (penalties) are drawn otherwise.
	plain, err := client.Sample(ctx, logits, batch, vocab, common()...)
	if err != nil {
		t.Fatal(err)
	}
	if want.Tokens[0] != 7 || plain.Tokens[0] == 7 || proto.Equal(plain.Logprobs[1], want.Logprobs[1]) {
		t.Errorf("row 0: token %d with its bias, %d without (want 7, then another); row 1: logprobs %v "+
			"with its history, %v without (want different)", want.Tokens[0], plain.Tokens[0],
			want.Logprobs[1], plain.Logprobs[1])
	}

	// Offsets that fit at the region's end, lists that do not: the server's OUT_OF_RANGE.
	copy(region.Bytes()[4080:], samplerd.PackLogitBias(bias)[:16])
	_, err = client.Sample(ctx, logits, batch, vocab, samplerd.LogitBiasRegion("go-lists", 4080))
	wantError(t, err, codes.OutOfRange, "logit_bias.region: expected 40 bytes at offset 4080, got a "+
		"region of 4096 bytes (B = 3, N = row_offsets[B] = 3: (B + 1 + 2N) * 4 bytes)")
	copy(region.Bytes()[4080:], history[:16])
	_, err = client.Sample(ctx, logits, batch, vocab, samplerd.TokenHistoryRegion("go-lists", 4080))
	wantError(t, err, codes.OutOfRange, "token_history.region: expected 61 bytes at offset 4080, got a "+
		"region of 4096 bytes (B = 3, N = row_offsets[B] = 5: (B + 1 + 2N) * 4 + N bytes)")
	_, err = client.Sample(ctx, logits, batch, vocab, samplerd.LogitBiasRegion("go-lists", 4088))
	wantError(t, err, codes.OutOfRange, "logit_bias.region: expected 16 bytes at offset 4088, got a "+
		"region of 4096 bytes (row_offsets: (B + 1) * 4 bytes for B = 3)")
}
