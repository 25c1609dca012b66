package samplerd

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"samplerd.dev/client/go/samplerdv1"
)

const (
	// DefaultTarget is where samplerd listens unless told otherwise (its --listen default).
	DefaultTarget = "unix:///run/samplerd/samplerd.sock"
	// DefaultMaxMessageBytes is the server's default message limit (Limits.max_message_bytes).
	// Inline fp32 logits take 4 bytes per element: 128 x 151,936 is ~74 MiB.
	DefaultMaxMessageBytes = 256 << 20
	// DefaultCallTimeout bounds each unary call whose context has no deadline.
	DefaultCallTimeout = 10 * time.Second
	// DefaultShmPrefix is the server's default --shm_prefix: host shm keys must start with it.
	DefaultShmPrefix = "/samplerd-"
	// ServiceName is the gRPC service name, also the name the server reports health under.
	ServiceName = "samplerd.v1.SamplerService"
)

// Option configures a Client (see Dial).
type Option func(*options)

type options struct {
	maxMessageBytes  int
	callTimeout      time.Duration
	streamChunkBytes int
	shmPrefix        string
	dialOptions      []grpc.DialOption
}

// WithMaxMessageBytes sets the largest message sent or received, in bytes (default
// DefaultMaxMessageBytes). Keep it <= the server's limit, or it answers RESOURCE_EXHAUSTED.
func WithMaxMessageBytes(n int) Option { return func(o *options) { o.maxMessageBytes = n } }

// WithCallTimeout sets the deadline given to unary calls whose context has none (default
// DefaultCallTimeout; 0 means none). Sessions never get one: they live as long as the engine.
func WithCallTimeout(d time.Duration) Option { return func(o *options) { o.callTimeout = d } }

// WithStreamChunkBytes makes Session steps whose inline logits exceed n bytes travel as
// several stream messages that the server reassembles (default 0: never split).
func WithStreamChunkBytes(n int) Option { return func(o *options) { o.streamChunkBytes = n } }

// WithShmPrefix sets the prefix of the host shm keys NewHostShmRegion creates; it must match
// the server's --shm_prefix (default DefaultShmPrefix).
func WithShmPrefix(prefix string) Option { return func(o *options) { o.shmPrefix = prefix } }

// WithDialOptions adds gRPC dial options (keepalive, interceptors, ...) after the client's own.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

// Client is a connection to one samplerd server.
type Client struct {
	conn *grpc.ClientConn
	stub samplerdv1.SamplerServiceClient
	opts options

	mu      sync.Mutex
	regions map[*HostShmRegion]struct{} // open regions made by NewHostShmRegion
	closed  bool                        // Close ran
}

// errClientClosed is returned by calls that need the client after Close.
var errClientClosed = &Error{Code: codes.FailedPrecondition,
	Message: "expected an open client, got a closed one"}

// Dial returns a Client for target: "unix:///abs/path.sock" or "host:port". It does not wait
// for the server: the connection is made in the background, and calls made before the server
// is up fail with UNAVAILABLE (WaitServing waits for it). Plaintext only: samplerd is a
// sidecar. Close the client when done.
func Dial(target string, opts ...Option) (*Client, error) {
	o := options{
		maxMessageBytes: DefaultMaxMessageBytes,
		callTimeout:     DefaultCallTimeout,
		shmPrefix:       DefaultShmPrefix,
	}
	for _, opt := range opts {
		opt(&o)
	}
	dial := append([]grpc.DialOption{
		grpc.WithInsecure(), // grpc-go 1.33 has no credentials/insecure
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(o.maxMessageBytes),
			grpc.MaxCallSendMsgSize(o.maxMessageBytes),
		),
	}, o.dialOptions...)
	conn, err := grpc.Dial(target, dial...)
	if err != nil {
		return nil, fromRPC(err)
	}
	return &Client{
		conn:    conn,
		stub:    samplerdv1.NewSamplerServiceClient(conn),
		opts:    o,
		regions: make(map[*HostShmRegion]struct{}),
	}, nil
}

// Close releases the host shm regions this client created and still holds (see
// HostShmRegion.Close), then closes the connection. Open sessions end with it. Closing twice
// is harmless: the second Close returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	regions := make([]*HostShmRegion, 0, len(c.regions))
	for r := range c.regions {
		regions = append(regions, r)
	}
	c.mu.Unlock()
	var first error
	for _, r := range regions {
		if err := r.Close(); err != nil && first == nil {
			first = err
		}
	}
	if err := c.conn.Close(); err != nil && first == nil {
		first = err
	}
	return first
}

// Stub returns the generated client, for calls this package does not wrap.
func (c *Client) Stub() samplerdv1.SamplerServiceClient { return c.stub }

// Conn returns the underlying connection (e.g. to share it with other stubs).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// ServerInfo describes the server: version, backend, devices and request limits.
func (c *Client) ServerInfo(ctx context.Context) (*samplerdv1.GetServerInfoResponse, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	info, err := c.stub.GetServerInfo(ctx, &samplerdv1.GetServerInfoRequest{})
	return info, fromRPC(err)
}

// WaitServing blocks until the server's health service reports ServiceName as SERVING (its
// devices are up and warmed), retrying every pollInterval, or until ctx is done; it then
// returns the last error seen. Use it at engine start-up and in tests. On a closed client it
// returns FAILED_PRECONDITION at once (no retry can succeed).
func (c *Client) WaitServing(ctx context.Context) error {
	const pollInterval = 20 * time.Millisecond
	health := healthpb.NewHealthClient(c.conn)
	for {
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return errClientClosed
		}
		attempt, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := health.Check(attempt, &healthpb.HealthCheckRequest{Service: ServiceName})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if err == nil {
			err = &Error{Code: codes.Unavailable, Message: "expected SERVING, got " + resp.GetStatus().String()}
		}
		c.conn.ResetConnectBackoff() // retry the connection now, not after gRPC's backoff
		select {
		case <-ctx.Done():
			return fromRPC(err)
		case <-time.After(pollInterval):
		}
	}
}

// callContext applies the default call timeout when ctx has no deadline.
func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || c.opts.callTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.opts.callTimeout)
}
