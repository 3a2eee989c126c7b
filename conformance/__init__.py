"""The routespec conformance suite: checks that cite requirement IDs, run through an adapter."""
