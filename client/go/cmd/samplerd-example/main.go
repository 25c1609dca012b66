// Command samplerd-example samples a small random fp32 batch with a running samplerd server
// and prints the token ids, inline or through a host shm region.
//
//	samplerd-example -target=unix:///run/samplerd/samplerd.sock -batch=4 -vocab=32000 -top_k=50
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"time"

	samplerd "samplerd.dev/client/go"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "samplerd-example:", err)
		os.Exit(1)
	}
}

// run parses args, samples once and prints the server, the tokens and the round-trip time.
func run(args []string, out io.Writer) error {
	flags := flag.NewFlagSet("samplerd-example", flag.ContinueOnError)
	target := flags.String("target", samplerd.DefaultTarget, `server address: "unix:///abs/path.sock" or "host:port"`)
	batch := flags.Int("batch", 4, "rows B")
	vocab := flags.Int("vocab", 32000, "vocabulary size V")
	temperature := flags.Float64("temperature", 1, "temperature (0: greedy)")
	topK := flags.Int("top_k", 50, "top-k (0: off)")
	topP := flags.Float64("top_p", 0.9, "top-p (1: off)")
	seed := flags.Uint64("seed", 1, "seed of every row's random stream (also of the logits)")
	shm := flags.Bool("shm", false, "send the logits through a host shm region (server on this host, unix socket)")
	if err := flags.Parse(args); err != nil {
		return err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := samplerd.Dial(*target)
	if err != nil {
		return err
	}
	defer client.Close()
	info, err := client.ServerInfo(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "samplerd %s, backend %v\n", info.Version, info.Backend)

	rng := rand.New(rand.NewSource(int64(*seed)))
	logits := make([]float32, *batch**vocab)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64())
	}
	opts := []samplerd.SampleOption{
		samplerd.Temperature(float32(*temperature)), samplerd.TopK(int32(*topK)),
		samplerd.TopP(float32(*topP)), samplerd.Seed(*seed),
	}
	start := time.Now()
	var res *samplerd.Result
	if *shm {
		region, err := client.NewHostShmRegion(ctx, fmt.Sprintf("example-%d", os.Getpid()), 4*len(logits))
		if err != nil {
			return err
		}
		defer region.Close()
		start = time.Now()
		res, err = region.Sample(ctx, logits, *batch, *vocab, opts...)
		if err != nil {
			return err
		}
	} else if res, err = client.Sample(ctx, logits, *batch, *vocab, opts...); err != nil {
		return err
	}
	fmt.Fprintf(out, "round trip %.3f ms (server compute %.3f ms)\n",
		float64(time.Since(start).Microseconds())/1e3, float64(res.Timings.GetComputeNs())/1e6)
	fmt.Fprintf(out, "tokens: %v\n", res.Tokens)
	return nil
}
