"""An OTLP/gRPC trace endpoint for tests, as a collector would be: the services export their
spans to it (OTEL_EXPORTER_OTLP_ENDPOINT), and what it keeps is the servicer's business."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from helmline.runtime.testing import free_port


@contextmanager
def otlp_endpoint(servicer: trace_service_pb2_grpc.TraceServiceServicer) -> Iterator[int]:
    """`servicer` serving on a free port of 127.0.0.1 while the block runs; the port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield port
    finally:
        server.stop(grace=None)
