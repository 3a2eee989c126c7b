"""Helper processes for the Dynamo interop tests: a real Dynamo worker and a real client."""
