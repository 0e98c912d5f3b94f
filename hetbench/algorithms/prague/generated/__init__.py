"""Generated gRPC code of the Group Generator service (regenerate: see group_generator.proto)."""
