"""`ggpo-batch dashboard`: a read-only web view of the ledger, served by the package.

Starlette (ASGI toolkit) + uvicorn (its server) + Jinja2 (templates shipped as package data):
small, widely used and well-kept libraries, no build step and no JavaScript framework. Pages are
rendered on the server from the same library calls the CLI makes (`views`); a few lines of plain
JavaScript (static/dashboard.js) refresh the live parts from fragment routes; `/api/...` returns
the same JSON as `status --json`. Access and secrets: `access`. Importing this package (and
serving it) never imports torch.
"""
