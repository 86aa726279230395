#!/usr/bin/env python3
"""A gRPC client on Python grpcio (grpc C-core) that calls one method on one of slicelet's unix
sockets and prints the answers.

It dials as C-core clients do: the target `unix:<path>` with the channel's default authority,
which C-core sets to the percent-encoded socket path (grpc/grpc#38142), unless `--authority`
overrides it. Messages are built at run time from a FileDescriptorSet (the protos slicelet
compiles, written by the test), so no generated code and no protoc are needed.

Usage:
    grpcio_client.py --socket PATH --descriptors FILE --method /pkg.Service/Method
                     [--request JSON] [--messages N] [--timeout S] [--authority A]

Each answer is printed as one line of JSON (protobuf field names); a server stream is read until
--messages answers arrived. A failed call prints "error: CODE: MESSAGE" on stderr and exits 1.
"""

import argparse
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--descriptors", required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--request", default="{}")
    p.add_argument("--messages", type=int, default=1)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--authority", default=None)
    a = p.parse_args()

    with open(a.descriptors, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for file in fds.file:
        pool.Add(file)
    service_name, _, method_name = a.method.lstrip("/").partition("/")
    method = pool.FindServiceByName(service_name).methods_by_name[method_name]
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    request = json_format.Parse(a.request, request_class())

    options = []
    if a.authority is not None:
        options.append(("grpc.default_authority", a.authority))
    with grpc.insecure_channel("unix:" + a.socket, options=options) as channel:
        kind = channel.unary_stream if method.server_streaming else channel.unary_unary
        call = kind(
            a.method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        try:
            if method.server_streaming:
                stream = call(request, timeout=a.timeout, wait_for_ready=True)
                answers = []
                for answer in stream:
                    answers.append(answer)
                    if len(answers) == a.messages:
                        stream.cancel()
                        break
            else:
                answers = [call(request, timeout=a.timeout, wait_for_ready=True)]
        except grpc.RpcError as e:
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    for answer in answers:
        print(json_format.MessageToJson(answer, preserving_proto_field_name=True, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
