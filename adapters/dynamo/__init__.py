"""Pieces shared by the adapters that drive the real Dynamo runtime."""
