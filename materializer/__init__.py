"""materializer package."""
