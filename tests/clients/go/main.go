// Command slicelet-interop-go is a gRPC client built on grpc-go, the gRPC library of the
// kubelet, that calls one method on one of slicelet's unix sockets and prints the answers.
//
// It dials exactly as the kubelet's plugin watcher does (pkg/kubelet/pluginmanager/
// operationexecutor/operation_generator.go, dial): grpc.Dial with the socket's plain path as
// the target, no "unix:" scheme, no WithAuthority, and a context dialer that opens the unix
// socket. grpc-go then sends the path as the HTTP/2 :authority.
//
// The messages are built at run time from a FileDescriptorSet (the protos slicelet compiles,
// written by the test) with dynamicpb, so no generated Go code and no protoc are needed.
//
// Usage:
//
//	slicelet-interop-go -socket PATH -descriptors FILE -method /pkg.Service/Method \
//	    -request JSON [-messages N] [-timeout 10s]
//
// Each answer is printed as one line of JSON (protobuf field names); a server stream is read
// until -messages answers arrived. A failed call prints "error: CODE: MESSAGE" on stderr and
// exits 1; bad arguments exit 2.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// codec marshals dynamicpb messages with the protobuf API v2 (grpc-go 1.33's own codec takes
// API v1 messages).
type codec struct{}

func (codec) Marshal(v interface{}) ([]byte, error) {
	return proto.Marshal(v.(proto.Message))
}

func (codec) Unmarshal(data []byte, v interface{}) error {
	return proto.Unmarshal(data, v.(proto.Message))
}

func (codec) Name() string { return "proto" }

func fail(code int, format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(code)
}

func main() {
	socket := flag.String("socket", "", "unix socket path, dialed as the kubelet dials it")
	descriptors := flag.String("descriptors", "", "FileDescriptorSet file")
	method := flag.String("method", "", "full method name, /package.Service/Method")
	request := flag.String("request", "{}", "request message as protobuf JSON")
	messages := flag.Int("messages", 1, "answers to read from a server stream")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline for the whole call")
	flag.Parse()
	if *socket == "" || *descriptors == "" || *method == "" {
		fail(2, "usage: -socket PATH -descriptors FILE -method /pkg.Service/Method [-request JSON]")
	}

	raw, err := ioutil.ReadFile(*descriptors)
	if err != nil {
		fail(2, "reading descriptors: %v", err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(raw, &set); err != nil {
		fail(2, "parsing descriptors: %v", err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		fail(2, "building descriptors: %v", err)
	}
	parts := strings.Split(strings.TrimPrefix(*method, "/"), "/")
	if len(parts) != 2 {
		fail(2, "method %q is not /package.Service/Method", *method)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(parts[0]))
	if err != nil {
		fail(2, "service %s: %v", parts[0], err)
	}
	service, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		fail(2, "%s is not a service", parts[0])
	}
	m := service.Methods().ByName(protoreflect.Name(parts[1]))
	if m == nil {
		fail(2, "service %s has no method %s", parts[0], parts[1])
	}
	req := dynamicpb.NewMessage(m.Input())
	if err := protojson.Unmarshal([]byte(*request), req); err != nil {
		fail(2, "request: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	// The kubelet's dial: the plain path as the target, a unix context dialer.
	conn, err := grpc.DialContext(ctx, *socket,
		grpc.WithInsecure(),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		fail(1, "error: dial %s: %v", *socket, err)
	}
	defer conn.Close()

	out := protojson.MarshalOptions{UseProtoNames: true}
	print := func(msg proto.Message) {
		b, err := out.Marshal(msg)
		if err != nil {
			fail(1, "error: printing the answer: %v", err)
		}
		fmt.Println(string(b))
	}
	callErr := func(err error) {
		s := status.Convert(err)
		fail(1, "error: %s: %s", s.Code(), s.Message())
	}

	if !m.IsStreamingServer() {
		resp := dynamicpb.NewMessage(m.Output())
		if err := conn.Invoke(ctx, *method, req, resp, grpc.ForceCodec(codec{})); err != nil {
			callErr(err)
		}
		print(resp)
		return
	}
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, *method, grpc.ForceCodec(codec{}))
	if err != nil {
		callErr(err)
	}
	if err := stream.SendMsg(req); err != nil {
		callErr(err)
	}
	if err := stream.CloseSend(); err != nil {
		callErr(err)
	}
	for i := 0; i < *messages; i++ {
		resp := dynamicpb.NewMessage(m.Output())
		if err := stream.RecvMsg(resp); err != nil {
			callErr(err)
		}
		print(resp)
	}
}
