// Package samplerd is the Go client of samplerd, the sidecar that samples the next token for
// LLM inference engines over gRPC (proto/samplerd/v1/sampler.proto).
//
//	client, err := samplerd.Dial("unix:///run/samplerd/samplerd.sock") // or "host:port"
//	if err != nil { ... }
//	defer client.Close()
//	res, err := client.Sample(ctx, logits, batch, vocab, // logits: []float32, batch*vocab long
//		samplerd.Temperature(0.8), samplerd.TopK(50), samplerd.TopP(0.9), samplerd.Seed(42))
//	// res.Tokens: one token id per row
//
// Sampling parameters given one value apply to every row; given B values (Temperature(t...)),
// one per row. Failures are *Error values carrying the gRPC code and the server's message
// ("expected X, got Y"); status.Code(err) works on them. A local OS failure (a host shm
// object) is an *Error too, which wraps the OS error for errors.Is and errors.As.
//
// A decode loop keeps one stream open for its lifetime: OpenSession, then Session.Sample once
// per step. Logits can also travel by reference through host shared memory: NewHostShmRegion
// creates and registers a POSIX shm object, and HostShmRegion.Sample writes logits into it and
// sends only {region, offset}. The generated API (package samplerdv1, made by generate.sh)
// stays available through Client.Stub for anything this package does not cover.
//
// Everything here is safe for concurrent use unless its comment says otherwise.
package samplerd
