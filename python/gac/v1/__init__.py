"""gac.v1: gacd's gRPC API for Python clients, generated from gac's own
``proto/gac/v1/*.proto`` when the package is built (no code generation on
the user's side).

    import grpc
    from gac.v1 import query_pb2, query_pb2_grpc

    with grpc.insecure_channel("127.0.0.1:7070") as channel:
        query = query_pb2_grpc.QueryServiceStub(channel)
        page = query.GetSteps(query_pb2.GetStepsRequest(run="exp-42"), timeout=10)

Modules, one per file of the wire contract: ``telemetry_pb2`` (StepRecord,
IngestRequest, IngestAck, Regime, ControlMode) with ``telemetry_pb2_grpc``
(IngestService), ``control_pb2`` with ``control_pb2_grpc`` (ControlService,
AdminService), ``query_pb2`` with ``query_pb2_grpc`` (QueryService); stubs
(``.pyi``) for the messages. docs/GACD.md says what each call does and which
rights it needs; a bearer token goes with each call as
``metadata=[("authorization", "Bearer " + token)]``.

They need the protobuf runtime (>= 4.21.12) and, for the ``_grpc`` modules,
grpcio (>= 1.51.1): ``pip install "gac[client]"``. ``import gac`` needs
neither and never imports this package.
"""

try:
    import google.protobuf  # type: ignore[import-untyped, unused-ignore]  # noqa: F401  (types-protobuf is optional)
except ImportError as e:
    raise ImportError(
        f"gac.v1 needs the protobuf runtime (and grpcio for its services): pip install 'gac[client]' ({e})"
    ) from e
