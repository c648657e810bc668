"""Shared fixtures. Each real service lives in its own plugin module under
``tests/fixtures/`` (S3 server, PostgreSQL), so that they can be read in one sitting."""

pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
]
