package ingestor

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

// Stream is an open subscription. Recv blocks until a message arrives or
// the stream is closed; Close unblocks it.
type Stream interface {
	// Recv returns the next message's frames (topic, seq, payload).
	Recv() ([][]byte, error)
	// Close ends the subscription and unblocks a Recv in progress.
	Close() error
}

// Transport opens the ZeroMQ sockets the ingestor uses. ZMQ is the default;
// tests may substitute fakes.
type Transport interface {
	// Subscribe dials a replica's PUB endpoint with a SUB socket filtered on
	// topic.
	Subscribe(ctx context.Context, endpoint, topic string) (Stream, error)
	// Listen binds one SUB socket that replicas connect their PUB to; it
	// receives every topic.
	Listen(ctx context.Context, endpoint string) (Stream, error)
	// Replay asks a replica's ROUTER for every buffered batch from seq on.
	// No reply within timeout (a bad request gets none) is an error.
	Replay(ctx context.Context, endpoint string, from uint64, timeout time.Duration, fn func(kvevents.Batch) error) error
}

// ZMQ is the Transport over github.com/go-zeromq/zmq4.
type ZMQ struct {
	// Dialer makes the SUB and DEALER sockets' connections to replicas,
	// enforcing the replica address policy on the address a name resolves
	// to. Nil means dialer.New(kvroute.AddressPolicy{}, nil): the default
	// policy, never an unchecked dial.
	Dialer *dialer.Dialer
}

// guardedScheme is the zmq4 transport that dials through the Dialer the
// socket's context carries; tcp:// endpoints are dialled as
// guardedScheme:// (guarded). zmq4 registers transports once per process
// by scheme and hands each dial the socket's context, so the context is
// the one way to give each socket its own policy without registering a
// scheme per policy. Checking the resolved address before zmq4 dials
// would leave zmq4 to resolve the name again, and that second answer is
// the one it connects to.
const guardedScheme = "kvroute-tcp"

func init() {
	if err := zmq4.RegisterTransport(guardedScheme, policyTransport{}); err != nil {
		panic(err)
	}
}

type dialerKey struct{}

// policyTransport is zmq4's tcp transport with dials through the
// context's Dialer; a context without one is refused (fail closed).
type policyTransport struct{}

func (policyTransport) Dial(ctx context.Context, zd transport.Dialer, addr string) (net.Conn, error) {
	d, ok := ctx.Value(dialerKey{}).(*dialer.Dialer)
	if !ok {
		return nil, fmt.Errorf("dial %s: no dialer in the socket's context: %w", addr, dialer.ErrRefused)
	}
	// The socket's own dialer carries its WithDialerTimeout.
	if nd, ok := zd.(*net.Dialer); ok && nd.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, nd.Timeout)
		defer cancel()
	}
	return d.DialContext(ctx, "tcp", addr)
}

func (policyTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return nil, fmt.Errorf("listen %s: %s:// only dials", addr, guardedScheme)
}

func (policyTransport) Addr(ep string) (string, error) { return transport.New("tcp").Addr(ep) }

// guarded is ctx carrying z's dialer, and endpoint dialled through it.
func (z ZMQ) guarded(ctx context.Context, endpoint string) (context.Context, string) {
	d := z.Dialer
	if d == nil {
		d = dialer.New(kvroute.AddressPolicy{}, nil)
	}
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		endpoint = guardedScheme + "://" + rest
	}
	return context.WithValue(ctx, dialerKey{}, d), endpoint
}

type zstream struct{ s zmq4.Socket }

func (z zstream) Recv() ([][]byte, error) {
	m, err := z.s.Recv()
	if err != nil {
		return nil, err
	}
	return m.Frames, nil
}

func (z zstream) Close() error { return z.s.Close() }

// Subscribe implements Transport. The dial is tried once: the caller owns
// the retry policy (jittered backoff), so that a dead replica costs nothing
// but its timer.
func (z ZMQ) Subscribe(ctx context.Context, endpoint, topic string) (Stream, error) {
	ctx, guarded := z.guarded(ctx, endpoint)
	s := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(5*time.Second), zmq4.WithLogger(discardLog))
	return openSub(s, topic, "dial", endpoint, func(string) error { return s.Dial(guarded) })
}

// Listen implements Transport.
func (ZMQ) Listen(ctx context.Context, endpoint string) (Stream, error) {
	s := zmq4.NewSub(ctx, zmq4.WithLogger(discardLog))
	return openSub(s, "", "listen", endpoint, s.Listen)
}

// openSub subscribes s to topic and connects it to endpoint with connect
// (s.Dial or s.Listen, named by verb in errors); s is closed on failure.
func openSub(s zmq4.Socket, topic, verb, endpoint string, connect func(string) error) (Stream, error) {
	if err := s.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		s.Close()
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	if err := connect(endpoint); err != nil {
		s.Close()
		return nil, fmt.Errorf("%s %s: %w", verb, endpoint, err)
	}
	return zstream{s}, nil
}

// Replay implements Transport with a DEALER socket: it sends ["", seq8] and
// reads replies until the end marker. A REQ socket would take one reply only.
func (z ZMQ) Replay(ctx context.Context, endpoint string, from uint64, timeout time.Duration, fn func(kvevents.Batch) error) error {
	ctx, guarded := z.guarded(ctx, endpoint)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(timeout), zmq4.WithTimeout(timeout), zmq4.WithLogger(discardLog))
	defer d.Close()
	if err := d.Dial(guarded); err != nil {
		return fmt.Errorf("replay dial %s: %w", endpoint, err)
	}
	seq := binary.BigEndian.AppendUint64(nil, from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, seq)); err != nil {
		return fmt.Errorf("replay send: %w", err)
	}
	// Recv only returns when the socket's context ends, so a watchdog
	// cancels it when the replica stays silent for timeout.
	var timedOut bool
	var mu sync.Mutex
	t := time.AfterFunc(timeout, func() { mu.Lock(); timedOut = true; mu.Unlock(); cancel() })
	defer t.Stop()
	for {
		m, err := d.Recv()
		if err != nil {
			mu.Lock()
			to := timedOut
			mu.Unlock()
			if to {
				return fmt.Errorf("replay: no answer within %v", timeout)
			}
			return fmt.Errorf("replay recv: %w", err)
		}
		t.Reset(timeout)
		r, err := kvevents.DecodeReplay(m.Frames)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if r.End {
			return nil
		}
		if err := fn(r.Batch); err != nil {
			return err
		}
	}
}

// discardLog silences zmq4's own logging: its reconnect chatter is not
// actionable, and the ingestor logs what the sockets' errors mean.
var discardLog = log.New(io.Discard, "", 0)
