package tests_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"

	"github.com/kvroute/kvroute/internal/wait"
)

// otlpSpan is one span a receiver was sent, decoded.
type otlpSpan struct {
	Trace, ID, Parent string
	Name              string
	Kind              string
	Attrs             map[string]string
	// Resource are the exporting process's resource attributes.
	Resource map[string]string
	Error    bool
}

// otlpReceiver is a real OTLP trace receiver on loopback: OTLP/HTTP
// (POST /v1/traces, protobuf, gzip or not) and OTLP/gRPC, decoding every
// ExportTraceServiceRequest into the spans it carries.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	t        testing.TB
	HTTPAddr string
	GRPCAddr string
	mu       sync.Mutex
	spans    []otlpSpan
	requests int
}

func newOTLPReceiver(t testing.TB) *otlpReceiver {
	t.Helper()
	rcv := &otlpReceiver{t: t}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", rcv.serveHTTP)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	rcv.HTTPAddr = ln.Addr().String()

	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, rcv)
	go func() { _ = gs.Serve(gln) }()
	t.Cleanup(gs.Stop)
	rcv.GRPCAddr = gln.Addr().String()
	return rcv
}

func (rcv *otlpReceiver) serveHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req collectortrace.ExportTraceServiceRequest
	if ct := r.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "want application/x-protobuf, got "+ct, http.StatusUnsupportedMediaType)
		return
	}
	if err := proto.Unmarshal(raw, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	rcv.add(&req)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Export is the OTLP/gRPC trace service.
func (rcv *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	rcv.add(req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (rcv *otlpReceiver) add(req *collectortrace.ExportTraceServiceRequest) {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	rcv.requests++
	for _, rs := range req.GetResourceSpans() {
		res := attrMap(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				rcv.spans = append(rcv.spans, otlpSpan{
					Trace: hex.EncodeToString(s.GetTraceId()), ID: hex.EncodeToString(s.GetSpanId()),
					Parent: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind().String(),
					Attrs: attrMap(s.GetAttributes()), Resource: res, Error: s.GetStatus().GetCode() == 2,
				})
			}
		}
	}
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

// all returns a copy of the spans received so far.
func (rcv *otlpReceiver) all() []otlpSpan {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	return append([]otlpSpan(nil), rcv.spans...)
}

// trace waits until trace id holds a span satisfying done (the batch
// processor exports within OTEL_BSP_SCHEDULE_DELAY), and returns the
// trace's spans by id.
func (rcv *otlpReceiver) trace(id string, done func(map[string]otlpSpan) bool) map[string]otlpSpan {
	rcv.t.Helper()
	var got map[string]otlpSpan
	wait.UntilNil(rcv.t, "trace "+id, func() error {
		got = map[string]otlpSpan{}
		for _, s := range rcv.all() {
			if s.Trace == id {
				got[s.ID] = s
			}
		}
		if !done(got) {
			return fmt.Errorf("spans received:\n%s", describeSpans(got))
		}
		return nil
	})
	return got
}

// named returns the spans of tr called name.
func named(tr map[string]otlpSpan, name string) []otlpSpan {
	var out []otlpSpan
	for _, s := range tr {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// children are the names of the spans whose parent is id.
func children(tr map[string]otlpSpan, id string) map[string]int {
	out := map[string]int{}
	for _, s := range tr {
		if s.Parent == id {
			out[s.Name]++
		}
	}
	return out
}

func describeSpans(tr map[string]otlpSpan) string {
	var b bytes.Buffer
	for _, s := range tr {
		fmt.Fprintf(&b, "  %s %s parent=%s %s\n", s.ID, s.Name, s.Parent, s.Attrs)
	}
	return b.String()
}

// parseTraceparent splits a W3C traceparent into trace and parent ids.
func parseTraceparent(tb testing.TB, v string) (traceID, spanID string) {
	tb.Helper()
	parts := strings.Split(v, "-")
	if len(parts) != 4 || parts[0] != "00" || len(parts[1]) != 32 || len(parts[2]) != 16 {
		tb.Fatalf("traceparent %q is not W3C trace context", v)
	}
	return parts[1], parts[2]
}

// otelEnv points this process's OpenTelemetry setup (and the children it
// starts) at rcv over protocol, sampling every trace and exporting its
// batches every 50 ms.
func otelEnv(t *testing.T, rcv *otlpReceiver, protocol string) {
	t.Helper()
	endpoint := "http://" + rcv.HTTPAddr
	if protocol == "grpc" {
		endpoint = "http://" + rcv.GRPCAddr
	}
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
		"OTEL_TRACES_SAMPLER":         "always_on",
		"OTEL_BSP_SCHEDULE_DELAY":     "50",
		"OTEL_SERVICE_NAME":           "kvroute-test",
		"OTEL_RESOURCE_ATTRIBUTES":    "deployment.environment.name=test",
	} {
		t.Setenv(k, v)
	}
}
