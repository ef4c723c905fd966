"""Acceptance tests: every scenario of the seeds the product was specified from.

One test per scenario, written from the user's side (a real broker, a real worker, real
MCP servers). `README.md` here is the index; `test_index.py` keeps it and the tests (and,
where `../shared/seeds/` exists, the seeds) in step.
"""
