"""End-to-end tests of the Python SDK and the client CLI."""
