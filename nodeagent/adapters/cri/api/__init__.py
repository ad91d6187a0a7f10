"""Generated protobuf messages for the CRI runtime.v1 subset in runtime_v1.proto.

Do not edit runtime_v1_pb2.py or .pyi by hand: run tools/gen_cri_proto.py.
"""
