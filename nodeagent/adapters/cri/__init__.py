"""The CRI image service over the runtime's unix socket: ``client`` (the ``ImageRuntime``
port), ``h2`` (unary gRPC over HTTP/2 with the h2 library), ``wire`` (gRPC framing,
status codes and metadata rules), ``api`` (the generated protobuf messages). See
docs/decisions/0004-cri-client-over-h2.md."""
